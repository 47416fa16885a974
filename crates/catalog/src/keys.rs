//! Key layout in a store, under one namespace `{ns}`. Every key is written once (puts never
//! overwrite) and nothing depends on listing keys, because Mooncake cannot list.
//!
//! | key                               | value                                  | written by        |
//! |-----------------------------------|----------------------------------------|-------------------|
//! | `{ns}/pack/{blake3}`              | packed file bytes                      | publish           |
//! | `{ns}/gen/{generation-id}`        | canonical manifest (id = its blake3)   | publish           |
//! | `{ns}/head/{compat-id}/{seq}`     | head record: seq -> generation         | publish           |
//! | `{ns}/index/{seq}`                | index entry: one compat id             | publish (first)   |
//! | `{ns}/compat/{compat-id}`         | marker: "this compat id is indexed"    | publish (first)   |
//! | `{ns}/floor/{compat-id}/{seq}`    | head floor: heads below it may be gone | gc                |
//! | `{ns}/gc/{seq}`                   | gc journal: what one gc run removes    | gc                |
//! | `{ns}/gc-done/{seq}`              | marker: that gc run finished           | gc                |
//! | `{ns}/pin/{generation-id}`        | pin record; its existence = pinned     | pin (unpin removes)|
//!
//! Sequences (`head`, `index`, `floor`, `gc`) are appended at `newest + 1` and read back to learn
//! who won the seq; without listing they are found by probing `exists` (doubling, then bisecting:
//! `walk`), which finds them when they are contiguous from their start. Anyone can write these
//! keys, so seqs are bounded (`walk::MAX_SEQ`) and every record is checked before it is used. `index`, `floor` and `gc` records are never
//! removed, so they are contiguous from 1. Heads are contiguous from the newest floor's `floor`
//! seq: gc writes a floor record *before* it removes any head below it, and never removes a head at
//! or above it (see `catalog` and `gc`).

use jitship_generation::{CompatId, ContentHash, GenerationId};
use jitship_store::{StoreError, check_key};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    namespace: String,
}

impl KeyLayout {
    pub fn new(namespace: &str) -> Result<Self, StoreError> {
        check_key(namespace)?;
        Ok(Self {
            namespace: namespace.trim_end_matches('/').to_owned(),
        })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn pack(&self, id: &ContentHash) -> String {
        format!("{}/pack/{id}", self.namespace)
    }

    pub fn packs_prefix(&self) -> String {
        format!("{}/pack/", self.namespace)
    }

    pub fn generation(&self, id: &GenerationId) -> String {
        format!("{}/gen/{id}", self.namespace)
    }

    pub fn generations_prefix(&self) -> String {
        format!("{}/gen/", self.namespace)
    }

    pub fn head(&self, compat: &CompatId, seq: u64) -> String {
        format!("{}/head/{compat}/{seq}", self.namespace)
    }

    pub fn heads_prefix(&self, compat: &CompatId) -> String {
        format!("{}/head/{compat}/", self.namespace)
    }

    /// Prefix of every head of every compat id (listing stores only).
    pub fn all_heads_prefix(&self) -> String {
        format!("{}/head/", self.namespace)
    }

    pub fn index(&self, seq: u64) -> String {
        format!("{}/index/{seq}", self.namespace)
    }

    pub fn index_prefix(&self) -> String {
        format!("{}/index/", self.namespace)
    }

    pub fn compat_marker(&self, compat: &CompatId) -> String {
        format!("{}/compat/{compat}", self.namespace)
    }

    pub fn floor(&self, compat: &CompatId, seq: u64) -> String {
        format!("{}/floor/{compat}/{seq}", self.namespace)
    }

    pub fn floors_prefix(&self, compat: &CompatId) -> String {
        format!("{}/floor/{compat}/", self.namespace)
    }

    pub fn gc_journal(&self, seq: u64) -> String {
        format!("{}/gc/{seq}", self.namespace)
    }

    pub fn gc_journal_prefix(&self) -> String {
        format!("{}/gc/", self.namespace)
    }

    pub fn gc_done(&self, seq: u64) -> String {
        format!("{}/gc-done/{seq}", self.namespace)
    }

    pub fn pin(&self, id: &GenerationId) -> String {
        format!("{}/pin/{id}", self.namespace)
    }
}
