//! Head records: which generation is newest for a compat id. Store keys cannot be overwritten, so
//! heads are versioned (`seq` 1, 2, 3, ...) and the highest stored seq wins.
//!
//! A head may carry the publisher's signature (see `jitship::trust`): it lives in the head record
//! itself, so it is written in the same put as the head (no second record that a crash or a race
//! could separate from it) and covers exactly what binds a generation to its place. Heads written
//! before signing existed have no `signature` field and still decode.

use serde::{Deserialize, Serialize};

use super::{CompatId, GenerationId};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadRecord {
    pub compat_id: CompatId,
    pub seq: u64,
    pub generation: GenerationId,
    /// Seconds since the Unix epoch.
    pub written_at: u64,
    /// Unique per write (host, pid, random nonce): a publisher reads its head back and compares
    /// this to learn whether it won the seq.
    pub writer: String,
    /// The publisher's ed25519 signature over the namespace, compat id, seq and generation id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<HeadSignature>,
}

/// A signature on a head record (made and checked by `jitship::trust`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadSignature {
    /// Which key signed: the first 16 hex digits of the blake3 of its public key.
    pub key_id: String,
    /// The 64-byte ed25519 signature, hex.
    pub ed25519: String,
}

impl HeadRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("head serialization cannot fail")
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}
