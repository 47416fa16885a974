//! Head records: which generation is newest for a compat id. Store keys cannot be overwritten, so
//! heads are versioned (`seq` 1, 2, 3, ...) and the highest stored seq wins.

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
}

impl HeadRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("head serialization cannot fail")
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}
