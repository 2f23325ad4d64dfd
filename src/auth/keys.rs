//! Signing keys: generation, the on-disk layout, and the [`KeyRing`] that
//! holds every key this server trusts.
//!
//! # Layout
//!
//! Keys live in `<state_dir>/keys/`:
//!
//! * `<kid>.key.pem`: the Ed25519 private key, PKCS#8 PEM, mode 0600;
//! * `<kid>.pub.pem`: its public key, SPKI PEM.
//!
//! A `<kid>.pub.pem` without a private key is loaded as a verify-only key
//! (useful to keep accepting tokens of a key whose private half was retired).
//! A `<kid>.key.pem` without a public file is fine: the public key is derived.
//! Other files in the directory are ignored.
//!
//! # Key ids
//!
//! [`KeyRing::generate`] names keys `k<YYYYMMDDTHHMMSSZ>-<6 hex>`, the UTC
//! creation time then a random suffix, e.g. `k20260101T120000Z-3fa9c2`. Kids
//! sort lexicographically by creation time, so the *newest* local private key
//! (the one that signs) is the greatest kid. Two keys made within the same
//! second order by their random suffix. Kids of keys copied in by hand can be
//! anything; they take part in the same lexicographic ordering.
//!
//! # Rotation
//!
//! `hdsd token keygen` (a new, newer key: new tokens are signed with it), then
//! reissue the tokens, then delete the old key's two files. While both keys
//! are present, tokens of either verify; once the old files are gone, tokens
//! signed by it are rejected as [`Rejection::UnknownKey`](super::Rejection).

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{SigningKey, VerifyingKey};
use jsonwebtoken::{DecodingKey, EncodingKey};
use rand::RngCore;

use crate::config::permissions::{check_owner, check_writable, Untrusted};

/// Name of the key directory inside the state directory.
pub const KEYS_DIR: &str = "keys";
/// File-name suffix of a private key (`<kid>.key.pem`).
pub const PRIVATE_SUFFIX: &str = ".key.pem";
/// File-name suffix of a public key (`<kid>.pub.pem`).
pub const PUBLIC_SUFFIX: &str = ".pub.pem";

/// An additional trusted public key from the configuration (a setting).
pub use crate::config::ExtraPublicKey;

/// A key pair written by [`KeyRing::generate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedKey {
    /// The new key id.
    pub kid: String,
    /// `<state_dir>/keys/<kid>.key.pem` (mode 0600).
    pub private_path: PathBuf,
    /// `<state_dir>/keys/<kid>.pub.pem`.
    pub public_path: PathBuf,
}

/// Why keys could not be generated or loaded. The messages name the file and
/// what to do.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// A file-system operation failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done, e.g. "read", "create".
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// [`KeyRing::generate`] found a file with the new key's name.
    #[error("key file {path} already exists; refusing to overwrite it")]
    AlreadyExists {
        /// The existing file.
        path: PathBuf,
    },
    /// A private key file is not an Ed25519 PKCS#8 PEM key.
    #[error("{path} is not an Ed25519 private key in PKCS#8 PEM (-----BEGIN PRIVATE KEY-----): {detail}")]
    BadPrivateKey {
        /// The file.
        path: PathBuf,
        /// The parser's complaint.
        detail: String,
    },
    /// A public key file is not an Ed25519 SPKI PEM key, or is a weak key.
    #[error("{path} is not a usable Ed25519 public key in SPKI PEM (-----BEGIN PUBLIC KEY-----): {detail}")]
    BadPublicKey {
        /// The file.
        path: PathBuf,
        /// The parser's complaint.
        detail: String,
    },
    /// `<kid>.pub.pem` is not the public half of `<kid>.key.pem`.
    #[error("{public} is not the public key of {private}; delete {public} (it is re-derived from the private key) or restore the right one")]
    KeyMismatch {
        /// The private key file.
        private: PathBuf,
        /// The public key file that does not match.
        public: PathBuf,
    },
    /// Two trusted keys claim the same kid.
    #[error("key id {kid:?} is used by both {first} and {second}; every key needs its own kid")]
    DuplicateKid {
        /// The kid.
        kid: String,
        /// Where it was seen first.
        first: PathBuf,
        /// Where it was seen again.
        second: PathBuf,
    },
    /// A configured kid is empty or contains characters a kid may not.
    #[error(
        "key id {kid:?} for {path} is invalid: use 1-128 printable ASCII characters, no spaces"
    )]
    InvalidKid {
        /// The kid.
        kid: String,
        /// The key file it names.
        path: PathBuf,
    },
    /// The keys directory or a key file could be changed by another user
    /// (writable by group or others, or owned by someone else).
    #[error(transparent)]
    Untrusted(#[from] Untrusted),
    /// PEM/DER encoding of a freshly generated key failed (should not happen).
    #[error("cannot encode the new key: {0}")]
    Encode(String),
}

/// A key that verifies tokens.
#[derive(Clone)]
struct Verifier {
    key: DecodingKey,
    public: VerifyingKey,
    /// The file it was read from; `None` for a key shared through the store.
    source: Option<PathBuf>,
}

/// A public key an instance published in the store shared by several
/// instances (PostgreSQL): the key id, who published it, and the key in SPKI
/// PEM, as in `<kid>.pub.pem`. Never a private key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SharedKey {
    /// The key id tokens signed by it carry.
    pub kid: String,
    /// The publishing instance's id (see [`publisher_id`]).
    pub publisher: String,
    /// The public key, SPKI PEM (`-----BEGIN PUBLIC KEY-----`).
    pub public_pem: String,
}

/// Name of the file in the state directory that holds the id under which
/// this instance publishes its public keys in a shared store.
pub const PUBLISHER_FILE: &str = "key-publisher-id";

/// The key that signs new tokens.
struct Signer {
    kid: String,
    key: EncodingKey,
}

/// The loaded keys: every trusted public key by kid, and the newest local
/// private key (if any) for signing.
pub struct KeyRing {
    keys_dir: PathBuf,
    verifiers: BTreeMap<String, Verifier>,
    signer: Option<Signer>,
    warnings: Vec<String>,
}

impl fmt::Debug for KeyRing {
    /// Kids only: never key material.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing")
            .field("keys_dir", &self.keys_dir)
            .field("kids", &self.kids())
            .field("signing_kid", &self.signing_kid())
            .finish()
    }
}

impl KeyRing {
    /// A ring with no keys: verifies nothing, signs nothing.
    pub fn empty(state_dir: &Path) -> KeyRing {
        KeyRing {
            keys_dir: state_dir.join(KEYS_DIR),
            verifiers: BTreeMap::new(),
            signer: None,
            warnings: Vec::new(),
        }
    }

    /// Loads `<state_dir>/keys/*.{key,pub}.pem` and the `extra` public keys.
    ///
    /// A missing keys directory gives an empty local set (not an error). Any
    /// unreadable or invalid key file, a public file that does not match its
    /// private key, or a kid used twice is an error: a server should not start
    /// with a key set other than the one the operator meant.
    pub fn load(state_dir: &Path, extra: &[ExtraPublicKey]) -> Result<KeyRing, KeyError> {
        let mut ring = KeyRing::empty(state_dir);
        let (privates, publics) = list_key_files(&ring.keys_dir)?;

        let mut newest: Option<(String, SigningKey)> = None;
        for (kid, path) in &privates {
            let signing = read_private(path)?;
            let derived = signing.verifying_key();
            if let Some(pub_path) = publics.get(kid) {
                if read_public(pub_path)? != derived {
                    return Err(KeyError::KeyMismatch {
                        private: path.clone(),
                        public: pub_path.clone(),
                    });
                }
            }
            if let Some(mode) = loose_mode(path) {
                ring.warnings.push(format!(
                    "private key {} has mode {mode:04o}: other users may read it; run `chmod 600 {}`",
                    path.display(),
                    path.display()
                ));
            }
            ring.verifiers.insert(
                kid.clone(),
                Verifier {
                    key: DecodingKey::from_ed_der(derived.as_bytes()),
                    public: derived,
                    source: Some(path.clone()),
                },
            );
            // BTreeMap iteration is in kid order: the last one is the newest.
            newest = Some((kid.clone(), signing));
        }
        for (kid, path) in &publics {
            if privates.contains_key(kid) {
                continue;
            }
            let key = read_public(path)?;
            ring.insert_verifier(kid, key, path)?;
        }
        for extra in extra {
            if !valid_kid(&extra.kid) {
                return Err(KeyError::InvalidKid {
                    kid: extra.kid.clone(),
                    path: extra.path.clone(),
                });
            }
            check_writable("public key file (auth.public_keys)", &extra.path)?;
            let key = read_public(&extra.path)?;
            ring.insert_verifier(&extra.kid, key, &extra.path)?;
        }

        if let Some((kid, signing)) = newest {
            let der = signing
                .to_pkcs8_der()
                .map_err(|e| KeyError::Encode(e.to_string()))?;
            ring.signer = Some(Signer {
                kid,
                key: EncodingKey::from_ed_der(der.as_bytes()),
            });
        }
        Ok(ring)
    }

    /// Creates a new key pair under `<state_dir>/keys/` (creating the
    /// directory with mode 0700 if needed) and returns its kid and paths.
    /// Once loaded, it is the newest key, so it signs new tokens. Never
    /// overwrites an existing file.
    pub fn generate(state_dir: &Path, now: DateTime<Utc>) -> Result<GeneratedKey, KeyError> {
        // The newest key (the last kid in order) signs: a key made in the
        // same second as another (or while the clock is behind its stamp)
        // is stamped one second after it, so it sorts last whatever its
        // random suffix.
        let (privates, _) = list_key_files(&state_dir.join(KEYS_DIR))?;
        let newest_stamp = privates
            .keys()
            .next_back()
            .and_then(|kid| kid.get(1..17))
            .and_then(|t| chrono::NaiveDateTime::parse_from_str(t, "%Y%m%dT%H%M%SZ").ok())
            .map(|t| t.and_utc());
        let stamp = match newest_stamp {
            Some(t) if t.timestamp() >= now.timestamp() => t + chrono::Duration::seconds(1),
            _ => now,
        };
        let mut suffix = [0u8; 3];
        rand::rngs::OsRng.fill_bytes(&mut suffix);
        let kid = format!("k{}-{}", stamp.format("%Y%m%dT%H%M%SZ"), hex(&suffix));
        generate_with_kid(state_dir, &kid)
    }

    /// Generates a key only if `<state_dir>/keys/` holds no private key yet
    /// (first start). Returns the new key, or `None` when one already exists.
    /// Does not validate existing keys: [`KeyRing::load`] does.
    pub fn ensure(state_dir: &Path, now: DateTime<Utc>) -> Result<Option<GeneratedKey>, KeyError> {
        let (privates, _) = list_key_files(&state_dir.join(KEYS_DIR))?;
        if privates.is_empty() {
            KeyRing::generate(state_dir, now).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Every trusted kid (local and extra), sorted.
    pub fn kids(&self) -> Vec<String> {
        self.verifiers.keys().cloned().collect()
    }

    /// The kid that [`KeyRing::issue`] signs with: the newest local private key.
    pub fn signing_kid(&self) -> Option<&str> {
        self.signer.as_ref().map(|s| s.kid.as_str())
    }

    /// Where the public key of `kid` was loaded from, if it is trusted and
    /// was read from a file (not taken from a shared store).
    pub fn key_source(&self, kid: &str) -> Option<&Path> {
        self.verifiers.get(kid).and_then(|v| v.source.as_deref())
    }

    /// Every trusted public key, kid -> SPKI PEM (the encoding of
    /// `<kid>.pub.pem`): what an instance publishes in a shared store.
    pub fn public_keys(&self) -> BTreeMap<String, String> {
        self.verifiers
            .iter()
            .filter_map(|(kid, v)| {
                let pem = v.public.to_public_key_pem(LineEnding::LF).ok()?;
                Some((kid.clone(), pem))
            })
            .collect()
    }

    /// A verify-only ring trusting this ring's keys and the `shared` ones,
    /// and the problems found (for the caller to log). A shared key is
    /// skipped when it does not parse, when instances published different
    /// keys under its kid, or when its kid names a different key here (the
    /// local file wins). The same key published several times is one key.
    pub fn with_shared(&self, shared: &[SharedKey]) -> (KeyRing, Vec<String>) {
        let mut ring = KeyRing {
            keys_dir: self.keys_dir.clone(),
            verifiers: self.verifiers.clone(),
            signer: None,
            warnings: Vec::new(),
        };
        let mut problems = Vec::new();
        let mut by_kid: BTreeMap<&str, Vec<(&str, VerifyingKey)>> = BTreeMap::new();
        for key in shared {
            match parse_public(&key.public_pem) {
                Ok(public) => by_kid
                    .entry(key.kid.as_str())
                    .or_default()
                    .push((key.publisher.as_str(), public)),
                Err(detail) => problems.push(format!(
                    "shared key {:?} published by {} is not a usable Ed25519 public key ({detail}); not trusted",
                    key.kid, key.publisher
                )),
            }
        }
        for (kid, published) in by_kid {
            let (first_publisher, public) = published[0];
            if let Some((other, _)) = published.iter().find(|(_, p)| *p != public) {
                problems.push(format!(
                    "shared key {kid:?} was published with different public keys by {first_publisher} and {other}; not trusted from the shared store: give each key its own kid"
                ));
                continue;
            }
            if !valid_kid(kid) {
                problems.push(format!(
                    "shared key id {kid:?} published by {first_publisher} is invalid; not trusted"
                ));
                continue;
            }
            match ring.verifiers.get(kid) {
                Some(local) if local.public == public => {}
                Some(_) => problems.push(format!(
                    "shared key {kid:?} published by {first_publisher} differs from the local key with that kid; the local one is kept: give each key its own kid"
                )),
                None => {
                    ring.verifiers.insert(
                        kid.to_string(),
                        Verifier {
                            key: DecodingKey::from_ed_der(public.as_bytes()),
                            public,
                            source: None,
                        },
                    );
                }
            }
        }
        (ring, problems)
    }

    /// `<state_dir>/keys`, where local keys are read and written.
    pub fn keys_dir(&self) -> &Path {
        &self.keys_dir
    }

    /// Non-fatal problems found while loading (e.g. a private key readable by
    /// other users), for the server to log.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    pub(super) fn signer(&self) -> Option<(&str, &EncodingKey)> {
        self.signer.as_ref().map(|s| (s.kid.as_str(), &s.key))
    }

    pub(super) fn decoding_key(&self, kid: &str) -> Option<&DecodingKey> {
        self.verifiers.get(kid).map(|v| &v.key)
    }

    fn insert_verifier(
        &mut self,
        kid: &str,
        key: VerifyingKey,
        path: &Path,
    ) -> Result<(), KeyError> {
        if let Some(existing) = self.verifiers.get(kid) {
            return Err(KeyError::DuplicateKid {
                kid: kid.to_string(),
                first: existing.source.clone().unwrap_or_default(),
                second: path.to_path_buf(),
            });
        }
        self.verifiers.insert(
            kid.to_string(),
            Verifier {
                key: DecodingKey::from_ed_der(key.as_bytes()),
                public: key,
                source: Some(path.to_path_buf()),
            },
        );
        Ok(())
    }
}

/// Writes a new key pair named `kid`; fails with [`KeyError::AlreadyExists`]
/// rather than overwrite.
pub(super) fn generate_with_kid(state_dir: &Path, kid: &str) -> Result<GeneratedKey, KeyError> {
    let dir = state_dir.join(KEYS_DIR);
    create_private_dir(&dir)?;
    let private_path = dir.join(format!("{kid}{PRIVATE_SUFFIX}"));
    let public_path = dir.join(format!("{kid}{PUBLIC_SUFFIX}"));
    if public_path.exists() {
        return Err(KeyError::AlreadyExists { path: public_path });
    }

    let signing = SigningKey::generate(&mut rand::rngs::OsRng);
    let private_pem = signing
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| KeyError::Encode(e.to_string()))?;
    let public_pem = signing
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| KeyError::Encode(e.to_string()))?;

    write_new(&private_path, private_pem.as_bytes(), 0o600)?;
    if let Err(e) = write_new(&public_path, public_pem.as_bytes(), 0o644) {
        // Leave no half-written pair behind.
        let _ = fs::remove_file(&private_path);
        return Err(e);
    }
    Ok(GeneratedKey {
        kid: kid.to_string(),
        private_path,
        public_path,
    })
}

/// `(private kid -> path, public kid -> path)` in `dir`; both empty if `dir`
/// does not exist. The directory and every key file in it must be hdsd's
/// own (its user's or root's) and writable by no one else: another user who
/// can add a file there could plant a key hdsd would trust.
#[allow(clippy::type_complexity)]
fn list_key_files(
    dir: &Path,
) -> Result<(BTreeMap<String, PathBuf>, BTreeMap<String, PathBuf>), KeyError> {
    let mut privates = BTreeMap::new();
    let mut publics = BTreeMap::new();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((privates, publics)),
        Err(source) => {
            return Err(KeyError::Io {
                action: "read directory",
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    check_writable("the keys directory", dir)?;
    check_owner("the keys directory", dir)?;
    for entry in entries {
        let entry = entry.map_err(|source| KeyError::Io {
            action: "read directory",
            path: dir.to_path_buf(),
            source,
        })?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let path = entry.path();
        if !path.is_file() {
            continue;
        }
        let (kid, into) = if let Some(kid) = name.strip_suffix(PRIVATE_SUFFIX) {
            (kid, &mut privates)
        } else if let Some(kid) = name.strip_suffix(PUBLIC_SUFFIX) {
            (kid, &mut publics)
        } else {
            continue;
        };
        if kid.is_empty() {
            continue;
        }
        check_writable("key file", &path)?;
        check_owner("key file", &path)?;
        into.insert(kid.to_string(), path);
    }
    Ok((privates, publics))
}

fn read_to_string(path: &Path) -> Result<String, KeyError> {
    fs::read_to_string(path).map_err(|source| KeyError::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    })
}

fn read_private(path: &Path) -> Result<SigningKey, KeyError> {
    let pem = zeroize::Zeroizing::new(read_to_string(path)?);
    SigningKey::from_pkcs8_pem(&pem).map_err(|e| KeyError::BadPrivateKey {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

fn read_public(path: &Path) -> Result<VerifyingKey, KeyError> {
    parse_public(&read_to_string(path)?).map_err(|detail| KeyError::BadPublicKey {
        path: path.to_path_buf(),
        detail,
    })
}

/// An Ed25519 public key in SPKI PEM, not a weak one; else the complaint.
fn parse_public(pem: &str) -> Result<VerifyingKey, String> {
    let key = VerifyingKey::from_public_key_pem(pem).map_err(|e| e.to_string())?;
    if key.is_weak() {
        return Err("weak (small-order) key".into());
    }
    Ok(key)
}

/// The id under which this instance publishes its public keys in a shared
/// store: read from `<state_dir>/key-publisher-id`, created on first use
/// (`<host>-<8 hex>`). It outlives restarts, so an instance started again
/// from the same state directory withdraws the keys it published and no
/// longer has.
pub fn publisher_id(state_dir: &Path) -> Result<String, KeyError> {
    let path = state_dir.join(PUBLISHER_FILE);
    match fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(KeyError::Io {
                action: "read",
                path,
                source,
            })
        }
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic()))
        .unwrap_or_else(|| "hdsd".to_string());
    let mut suffix = [0u8; 4];
    rand::rngs::OsRng.fill_bytes(&mut suffix);
    let id = format!("{host}-{}", hex(&suffix));
    fs::create_dir_all(state_dir).map_err(|source| KeyError::Io {
        action: "create directory",
        path: state_dir.to_path_buf(),
        source,
    })?;
    fs::write(&path, format!("{id}\n")).map_err(|source| KeyError::Io {
        action: "write",
        path,
        source,
    })?;
    Ok(id)
}

/// A kid from configuration: 1-128 visible ASCII characters.
fn valid_kid(kid: &str) -> bool {
    !kid.is_empty() && kid.len() <= 128 && kid.bytes().all(|b| b.is_ascii_graphic())
}

pub(super) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(unix)]
fn create_private_dir(dir: &Path) -> Result<(), KeyError> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| KeyError::Io {
            action: "create directory",
            path: dir.to_path_buf(),
            source,
        })
}

#[cfg(not(unix))]
fn create_private_dir(dir: &Path) -> Result<(), KeyError> {
    fs::create_dir_all(dir).map_err(|source| KeyError::Io {
        action: "create directory",
        path: dir.to_path_buf(),
        source,
    })
}

/// Creates `path` (which must not exist) with `mode` and writes `contents`.
fn write_new(path: &Path, contents: &[u8], mode: u32) -> Result<(), KeyError> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(path).map_err(|source| {
        if source.kind() == io::ErrorKind::AlreadyExists {
            KeyError::AlreadyExists {
                path: path.to_path_buf(),
            }
        } else {
            KeyError::Io {
                action: "create",
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(|source| KeyError::Io {
            action: "write",
            path: path.to_path_buf(),
            source,
        })
}

/// The file's permission bits if group or others have any access.
#[cfg(unix)]
fn loose_mode(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then_some(mode)
}

#[cfg(not(unix))]
fn loose_mode(_path: &Path) -> Option<u32> {
    None
}
