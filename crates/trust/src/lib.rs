//! Signed generations: who vouches for a head, and whether this host believes them.
//!
//! A cache holds code (`.so`, `.cubin`) that the engine loads into the server process, and anyone
//! who can put a key into the store can write a head. Content hashes only prove that bytes match
//! their manifest; a signature proves which publisher chose that manifest for that place.
//!
//! What is signed (`signed_message`): the namespace, the compat id, the head seq and the generation
//! id. The generation id is the blake3 of the canonical manifest, so the signature covers every
//! file's path, mode and hash, the packs, and the cache kind and compat key recorded in it; the
//! compat id is blake3(kind, key), so a signed generation cannot be replayed under another compat
//! id, another namespace or another seq. The record's `written_at` and `writer` are bookkeeping
//! and are not signed.
//!
//! Keys are ed25519 (`ed25519-dalek`). A private key file is PKCS#8 PEM (what `openssl genpkey
//! -algorithm ed25519` writes too); a public key is one line, `ed25519:<64 hex digits>`, and a key
//! id is the first 16 hex digits of the blake3 of the public key.
//!
//! `TrustPolicy::judge` classifies a head (`Signer`); `admits` decides from the mode whether it
//! may be installed or built on: `off` admits everything (signatures are only shown), `warn` admits
//! everything and logs what is not trusted, `required` admits only heads validly signed by a
//! trusted key.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey};
use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use serde::{Deserialize, Serialize};

use jitship_generation::{HeadRecord, HeadSignature};

/// `[trust]`: which publishers' generations are installed and built on, and this publisher's key
/// (see the module docs, docs/guide/security.md and docs/threat-model.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrustConfig {
    /// `required`, `warn` or `off`. Unset: `required` once a trusted key is configured, else `off`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<TrustMode>,
    /// Trusted public keys, `ed25519:<64 hex digits>` as `jitship key generate` prints them.
    /// Several at once during a key rotation.
    pub trusted_keys: Vec<String>,
    /// Files holding one trusted public key each (that form, or a PEM `PUBLIC KEY`), e.g. a
    /// mounted ConfigMap.
    pub trusted_key_files: Vec<PathBuf>,
    /// This publisher's private key (PKCS#8 PEM, as `jitship key generate` writes it). Publish and
    /// watch sign every head they write with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signing_key_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum TrustMode {
    /// Signatures are shown but not checked before use.
    Off,
    /// Unsigned or untrusted generations are used, with a warning.
    Warn,
    /// Only generations signed by a trusted key are installed or built on.
    Required,
}

impl TrustMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Warn => "warn",
            Self::Required => "required",
        }
    }
}

impl TrustConfig {
    /// The mode in force: the configured one, else `required` when trusted keys are configured.
    pub fn effective_mode(&self) -> TrustMode {
        self.mode.unwrap_or(
            if self.trusted_keys.is_empty() && self.trusted_key_files.is_empty() {
                TrustMode::Off
            } else {
                TrustMode::Required
            },
        )
    }
}

pub const PUBLIC_KEY_PREFIX: &str = "ed25519:";

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("reading key file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is not an ed25519 private key in PKCS#8 PEM (-----BEGIN PRIVATE KEY-----): {message}; \
         make one with `jitship key generate --out FILE`"
    )]
    BadPrivateKey { path: PathBuf, message: String },
    #[error(
        "{text:?} is not a public key: expected `ed25519:` and 64 hex digits (as `jitship key \
         generate` prints) or a PEM PUBLIC KEY: {message}"
    )]
    BadPublicKey { text: String, message: String },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{0} exists already; jitship never overwrites a key (remove it first, or pick another path)"
    )]
    Exists(PathBuf),
    #[error("no randomness from the operating system for a new key: {0}")]
    Random(String),
}

/// What a head's signature says about it, for this host's trusted keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Signer {
    /// No signature (a publisher without a signing key, or a head written before signing).
    Unsigned,
    /// A valid signature by a trusted key.
    Trusted { key_id: String },
    /// Signed by a key this host does not trust (or whose id it does not know).
    Untrusted { key_id: String },
    /// Claims a trusted key, but the signature does not match the head: altered or forged.
    Forged { key_id: String },
}

impl Signer {
    pub fn key_id(&self) -> Option<&str> {
        match self {
            Self::Unsigned => None,
            Self::Trusted { key_id } | Self::Untrusted { key_id } | Self::Forged { key_id } => {
                Some(key_id)
            }
        }
    }

    /// One word for tables: `trusted`, `unsigned`, `untrusted`, `forged`.
    pub fn status(&self) -> &'static str {
        match self {
            Self::Unsigned => "unsigned",
            Self::Trusted { .. } => "trusted",
            Self::Untrusted { .. } => "untrusted",
            Self::Forged { .. } => "forged",
        }
    }
}

impl fmt::Display for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unsigned => write!(f, "unsigned"),
            Self::Trusted { key_id } => write!(f, "signed by trusted key {key_id}"),
            Self::Untrusted { key_id } => write!(f, "signed by key {key_id}, which is not trusted"),
            Self::Forged { key_id } => {
                write!(
                    f,
                    "forged: the signature claims key {key_id} but does not match"
                )
            }
        }
    }
}

/// A key id: the first 16 hex digits of the blake3 of the 32-byte public key.
pub fn key_id(key: &VerifyingKey) -> String {
    jitship_generation::ContentHash::of(key.as_bytes()).short_hex(16)
}

/// `ed25519:<64 hex digits>`.
pub fn public_key_text(key: &VerifyingKey) -> String {
    let hex: String = key.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("{PUBLIC_KEY_PREFIX}{hex}")
}

/// A public key in the one-line form, or a PEM `PUBLIC KEY` (SubjectPublicKeyInfo).
pub fn parse_public_key(text: &str) -> Result<VerifyingKey, TrustError> {
    let bad = |message: &str| TrustError::BadPublicKey {
        text: text.chars().take(120).collect(),
        message: message.into(),
    };
    let trimmed = text.trim();
    if trimmed.starts_with("-----BEGIN") {
        return VerifyingKey::from_public_key_pem(trimmed).map_err(|e| bad(&e.to_string()));
    }
    let hex = trimmed
        .strip_prefix(PUBLIC_KEY_PREFIX)
        .ok_or_else(|| bad("missing the `ed25519:` prefix"))?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad("expected 64 hex digits after the prefix"));
    }
    let mut bytes = [0u8; 32];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("checked hex");
    }
    VerifyingKey::from_bytes(&bytes).map_err(|e| bad(&e.to_string()))
}

/// The bytes a head signature covers. Namespaces are store keys (no newlines), ids are hex.
pub fn signed_message(namespace: &str, head: &HeadRecord) -> Vec<u8> {
    format!(
        "jitship head signature v1\nnamespace {namespace}\ncompat {}\nseq {}\ngeneration {}\n",
        head.compat_id, head.seq, head.generation
    )
    .into_bytes()
}

/// A publisher's private key. Its `Debug` shows the key id only: the secret is never printed.
#[derive(Clone)]
pub struct PublisherKey {
    key: SigningKey,
    id: String,
}

impl fmt::Debug for PublisherKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublisherKey")
            .field("key_id", &self.id)
            .finish_non_exhaustive()
    }
}

impl PublisherKey {
    /// A fresh key from the operating system's randomness.
    pub fn generate() -> Result<Self, TrustError> {
        let mut secret = zeroize::Zeroizing::new([0u8; 32]);
        getrandom::fill(secret.as_mut()).map_err(|e| TrustError::Random(e.to_string()))?;
        Ok(Self::from_signing_key(SigningKey::from_bytes(&secret)))
    }

    fn from_signing_key(key: SigningKey) -> Self {
        let id = key_id(&key.verifying_key());
        Self { key, id }
    }

    /// Reads a PKCS#8 PEM private key file. A file others can read is used with a warning (a
    /// Kubernetes secret is mounted 0644 unless `defaultMode` says otherwise).
    pub fn load(path: &Path) -> Result<Self, TrustError> {
        let read = |source| TrustError::Read {
            path: path.into(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read)?;
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{:o}", meta.permissions().mode() & 0o777),
                "the signing key file is readable by other users; make it 0600 (or set the secret's defaultMode: 0400)"
            );
        }
        let text = zeroize::Zeroizing::new(std::fs::read_to_string(path).map_err(read)?);
        let key =
            SigningKey::from_pkcs8_pem(text.trim()).map_err(|e| TrustError::BadPrivateKey {
                path: path.into(),
                message: e.to_string(),
            })?;
        Ok(Self::from_signing_key(key))
    }

    /// Writes the private key to `path` (created, never overwritten, mode 0600 from the start).
    pub fn save(&self, path: &Path) -> Result<(), TrustError> {
        let pem = self
            .key
            .to_pkcs8_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
            .map_err(|e| TrustError::Write {
                path: path.into(),
                source: std::io::Error::other(e.to_string()),
            })?;
        write_new(path, pem.as_bytes(), 0o600)
    }

    pub fn key_id(&self) -> &str {
        &self.id
    }

    pub fn public_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// Signs `head` in place for `namespace`.
    pub fn sign(&self, namespace: &str, head: &mut HeadRecord) {
        head.signature = None;
        let signature = self.key.sign(&signed_message(namespace, head));
        head.signature = Some(HeadSignature {
            key_id: self.id.clone(),
            ed25519: signature
                .to_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        });
    }
}

/// Creates `path` with `mode` and `bytes`, refusing an existing file.
pub fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TrustError> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|source| {
            if source.kind() == std::io::ErrorKind::AlreadyExists {
                TrustError::Exists(path.into())
            } else {
                TrustError::Write {
                    path: path.into(),
                    source,
                }
            }
        })?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|source| TrustError::Write {
            path: path.into(),
            source,
        })
}

/// What a publisher needs: its key (to sign the heads it writes) and its trust (to choose the
/// parent it builds on and the heads it merges: a publisher never folds files of a head its trust
/// does not admit into a generation it signs).
///
/// The fields are private so the signing-publisher rule holds for every value: built only by
/// `new` (or `Default`: no key, mode `off`), a publisher with a key always builds with the
/// tightened policy (`TrustPolicy::for_signing_publisher`).
#[derive(Debug, Clone, Default)]
pub struct PublishTrust {
    signing_key: Option<std::sync::Arc<PublisherKey>>,
    policy: std::sync::Arc<TrustPolicy>,
    /// A signing publisher whose configured mode is `required`: no install may use a head this
    /// trust refuses, so the publisher removes those above its base (`publish::reach`).
    removes_untrusted: bool,
}

impl PublishTrust {
    /// A publisher's trust. With a signing key, `policy` is tightened for publishing
    /// (`TrustPolicy::for_signing_publisher`): the key's own heads and trusted ones only.
    pub fn new(
        signing_key: Option<std::sync::Arc<PublisherKey>>,
        policy: std::sync::Arc<TrustPolicy>,
    ) -> Self {
        let removes_untrusted = signing_key.is_some() && policy.mode() == TrustMode::Required;
        let policy = match &signing_key {
            Some(key) => std::sync::Arc::new(policy.for_signing_publisher(key)),
            None => policy,
        };
        Self {
            signing_key,
            policy,
            removes_untrusted,
        }
    }

    /// The key that signs the heads this publisher writes, if any.
    pub fn signing_key(&self) -> Option<&PublisherKey> {
        self.signing_key.as_deref()
    }

    /// The policy this publisher builds and merges with (tightened when it signs).
    pub fn policy(&self) -> &TrustPolicy {
        &self.policy
    }

    /// A signing publisher whose configured mode is `required`: no install may use a head this
    /// trust refuses, so the publisher removes those above its base (`publish::reach`).
    pub fn removes_untrusted(&self) -> bool {
        self.removes_untrusted
    }

    /// Judges `head` and applies the mode (see `TrustPolicy::admits`).
    pub fn admits(&self, namespace: &str, head: &HeadRecord) -> bool {
        let signer = self.policy.judge(namespace, head);
        self.policy.admits(
            &signer,
            &format_args!("head {} of compat id {}", head.seq, head.compat_id),
        )
    }
}

/// This host's trust: the mode and the trusted public keys.
#[derive(Debug, Clone)]
pub struct TrustPolicy {
    mode: TrustMode,
    keys: Vec<(String, VerifyingKey)>,
}

impl Default for TrustPolicy {
    /// Mode `off`, no trusted keys: signatures are shown (as untrusted) and never enforced.
    fn default() -> Self {
        Self {
            mode: TrustMode::Off,
            keys: vec![],
        }
    }
}

impl TrustPolicy {
    pub fn new(mode: TrustMode, keys: &[VerifyingKey]) -> Self {
        Self {
            mode,
            keys: keys.iter().map(|k| (key_id(k), *k)).collect(),
        }
    }

    /// From `[trust]`: inline keys, then key files.
    pub fn from_config(config: &TrustConfig) -> Result<Self, TrustError> {
        let mut keys = Vec::new();
        for text in &config.trusted_keys {
            keys.push(parse_public_key(text)?);
        }
        for path in &config.trusted_key_files {
            let text = std::fs::read_to_string(path).map_err(|source| TrustError::Read {
                path: path.clone(),
                source,
            })?;
            keys.push(parse_public_key(&text)?);
        }
        Ok(Self::new(config.effective_mode(), &keys))
    }

    pub fn mode(&self) -> TrustMode {
        self.mode
    }

    /// The trust a publisher holding `own` builds with: `required`, with its own key trusted
    /// beside the configured ones, whatever `[trust] mode` says. A signing publisher never builds
    /// on, merges or re-signs a head it does not trust, so its signature never vouches for files
    /// that another store writer put there (`mode` loosens only what installs and store commands
    /// accept).
    pub fn for_signing_publisher(&self, own: &PublisherKey) -> Self {
        let mut keys = self.keys.clone();
        if !keys.iter().any(|(id, _)| id == own.key_id()) {
            let public = own.public_key();
            keys.push((key_id(&public), public));
        }
        Self {
            mode: TrustMode::Required,
            keys,
        }
    }

    pub fn trusted_key_ids(&self) -> Vec<&str> {
        self.keys.iter().map(|(id, _)| id.as_str()).collect()
    }

    /// Who signed `head` (written under `namespace`), as far as this host can tell.
    pub fn judge(&self, namespace: &str, head: &HeadRecord) -> Signer {
        let Some(sig) = &head.signature else {
            return Signer::Unsigned;
        };
        let key_id = sig.key_id.clone();
        let Some((_, key)) = self.keys.iter().find(|(id, _)| *id == sig.key_id) else {
            return Signer::Untrusted { key_id };
        };
        let Some(signature) = decode_signature(&sig.ed25519) else {
            return Signer::Forged { key_id };
        };
        let mut unsigned = head.clone();
        unsigned.signature = None;
        match key.verify(&signed_message(namespace, &unsigned), &signature) {
            Ok(()) => Signer::Trusted { key_id },
            Err(_) => Signer::Forged { key_id },
        }
    }

    /// Whether a head judged `signer` may be installed or built on under this mode. `warn` logs
    /// what it lets through.
    pub fn admits(&self, signer: &Signer, what: &dyn fmt::Display) -> bool {
        match (self.mode, signer) {
            (_, Signer::Trusted { .. }) | (TrustMode::Off, _) => true,
            (TrustMode::Warn, _) => {
                tracing::warn!("{what} is {signer}; using it anyway (trust mode warn)");
                true
            }
            (TrustMode::Required, _) => false,
        }
    }
}

fn decode_signature(hex: &str) -> Option<Signature> {
    if hex.len() != 128 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut bytes = [0u8; 64];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(Signature::from_bytes(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_generation::{CompatId, ContentHash, GenerationId};

    fn head(kind: &str, seq: u64) -> HeadRecord {
        HeadRecord {
            compat_id: CompatId::new(kind, "key"),
            seq,
            generation: GenerationId(ContentHash::of(b"manifest")),
            written_at: 1,
            writer: "w".into(),
            signature: None,
        }
    }

    #[test]
    fn a_signed_head_is_trusted_only_in_its_place() {
        let key = PublisherKey::generate().unwrap();
        let trust = TrustPolicy::new(TrustMode::Required, &[key.public_key()]);
        let mut h = head("triton", 3);
        key.sign("ns", &mut h);
        assert_eq!(
            trust.judge("ns", &h),
            Signer::Trusted {
                key_id: key.key_id().into()
            }
        );
        // Signatures are deterministic: the read-back comparison of a publisher's head holds.
        let mut again = head("triton", 3);
        key.sign("ns", &mut again);
        assert_eq!(again, h);
        // Another namespace, compat id, seq or generation: the same signature no longer matches.
        assert!(matches!(trust.judge("other", &h), Signer::Forged { .. }));
        let mut moved = h.clone();
        moved.compat_id = CompatId::new("inductor", "key");
        assert!(matches!(trust.judge("ns", &moved), Signer::Forged { .. }));
        let mut moved = h.clone();
        moved.seq = 9;
        assert!(matches!(trust.judge("ns", &moved), Signer::Forged { .. }));
        let mut moved = h.clone();
        moved.generation = GenerationId(ContentHash::of(b"evil"));
        assert!(matches!(trust.judge("ns", &moved), Signer::Forged { .. }));
        // Bookkeeping fields are not signed.
        let mut touched = h.clone();
        touched.writer = "someone".into();
        assert!(matches!(
            trust.judge("ns", &touched),
            Signer::Trusted { .. }
        ));
    }

    #[test]
    fn modes_admit_what_they_say() {
        let key = PublisherKey::generate().unwrap();
        let other = PublisherKey::generate().unwrap();
        let mut signed_by_other = head("k", 1);
        other.sign("ns", &mut signed_by_other);
        let unsigned = head("k", 1);
        for (mode, admitted) in [
            (TrustMode::Off, true),
            (TrustMode::Warn, true),
            (TrustMode::Required, false),
        ] {
            let trust = TrustPolicy::new(mode, &[key.public_key()]);
            for h in [&signed_by_other, &unsigned] {
                let s = trust.judge("ns", h);
                assert_eq!(trust.admits(&s, &"head"), admitted, "{mode:?} {s}");
            }
        }
        let trust = TrustPolicy::new(TrustMode::Required, &[key.public_key()]);
        assert_eq!(
            trust.judge("ns", &signed_by_other),
            Signer::Untrusted {
                key_id: other.key_id().into()
            }
        );
        assert_eq!(trust.judge("ns", &unsigned), Signer::Unsigned);
    }

    #[test]
    fn keys_round_trip_through_their_files_and_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("signing.key");
        let key = PublisherKey::generate().unwrap();
        key.save(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(matches!(key.save(&path), Err(TrustError::Exists(_))));
        let loaded = PublisherKey::load(&path).unwrap();
        assert_eq!(loaded.key_id(), key.key_id());
        assert!(!format!("{loaded:?}").contains("PRIVATE"));
        let text = public_key_text(&key.public_key());
        assert_eq!(parse_public_key(&text).unwrap(), key.public_key());
        assert!(parse_public_key("ed25519:00").is_err());
        assert!(parse_public_key(&text[8..]).is_err());
        std::fs::write(dir.path().join("bad.key"), "not a key").unwrap();
        let err = PublisherKey::load(&dir.path().join("bad.key")).unwrap_err();
        assert!(err.to_string().contains("jitship key generate"), "{err}");
    }
}
