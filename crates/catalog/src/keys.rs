//! Key layout in a store, under one namespace `{ns}`. Every key is written once (puts never
//! overwrite) and nothing depends on listing keys, because Mooncake cannot list.
//!
//! | key                               | value                                  | written by        |
//! |-----------------------------------|----------------------------------------|-------------------|
//! | `{ns}/pack/{blake3}`              | packed file bytes                      | publish           |
//! | `{ns}/replica/{k}/{blake3}`       | copy k (1..replicas) of that pack      | publish           |
//! | `{ns}/gen/{generation-id}`        | canonical manifest (id = its blake3)   | publish           |
//! | `{ns}/head/{compat-id}/{seq}`     | head record: seq -> generation         | publish           |
//! | `{ns}/contrib/{compat-id}/{seq}/{slot}` | contribution: a lost race's generation, merged by the next head | publish |
//! | `{ns}/index/{seq}`                | index entry: one compat id             | publish (first)   |
//! | `{ns}/compat/{compat-id}`         | marker: "this compat id is indexed"    | publish (first)   |
//! | `{ns}/floor/{compat-id}/{seq}`    | head floor: heads below it may be gone | gc                |
//! | `{ns}/gc/{seq}`                   | gc journal: what one gc run removes    | gc                |
//! | `{ns}/gc-done/{seq}`              | marker: that gc run finished           | gc                |
//! | `{ns}/pin/{generation-id}`        | pin record; its existence = pinned     | pin (unpin removes)|
//! | `{ns}/module/{blake3}`            | a policy module a manifest names by digest | publish      |
//!
//! Sequences (`head`, `index`, `floor`, `gc`) are appended at `newest + 1` and read back to learn
//! who won the seq; without listing they are found by probing `exists` (doubling, then bisecting:
//! `walk`), which finds them when they are contiguous from their start. Anyone can write these
//! keys, so seqs are bounded (`walk::MAX_SEQ`) and every record is checked before it is used. `index`, `floor` and `gc` records are never
//! removed, so they are contiguous from 1. Heads are contiguous from the newest floor's `floor`
//! seq: gc writes a floor record *before* it removes any head below it, and never removes a head at
//! or above it (see `catalog` and `gc`).
//!
//! Pack replicas (`[publish] pack_replicas`, at most `KeyLayout::MAX_PACK_REPLICAS`) are whole
//! copies of a pack under keys of their own, so that Mooncake can place them on other store nodes
//! and a rollout's reads spread over them (its own replicas do not: a client reads the first
//! complete one). Installs pick one at random and fall back to the others; gc removes every
//! possible one (it cannot list them).

use jitship_generation::{CompatId, ContentHash, GenerationId};
use jitship_store::{StoreError, check_key};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    namespace: String,
    /// Copies of each pack publish writes and installs pick from, the primary included (>= 1).
    pack_replicas: u32,
}

impl KeyLayout {
    /// Most copies of a pack (the primary included) `pack_replicas` may ask for; gc looks for
    /// this many, whatever this deployment's setting, so lowering it leaves nothing behind.
    pub const MAX_PACK_REPLICAS: u32 = 8;

    pub fn new(namespace: &str) -> Result<Self, StoreError> {
        check_key(namespace)?;
        Ok(Self {
            namespace: namespace.trim_end_matches('/').to_owned(),
            pack_replicas: 1,
        })
    }

    /// This layout with `n` copies of each pack (the primary included), clamped to
    /// `1..=Self::MAX_PACK_REPLICAS` (the config refuses values outside it).
    pub fn with_pack_replicas(mut self, n: u32) -> Self {
        self.pack_replicas = n.clamp(1, Self::MAX_PACK_REPLICAS);
        self
    }

    pub fn pack_replicas(&self) -> u32 {
        self.pack_replicas
    }

    /// Key of copy `k` of a pack: 0 is the primary (`pack`), 1.. a replica.
    pub fn pack_copy(&self, id: &ContentHash, k: u32) -> String {
        match k {
            0 => self.pack(id),
            k => format!("{}/replica/{k}/{id}", self.namespace),
        }
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

    /// A contribution slot at head seq `seq` (`contributions`): slots are probed, never walked.
    pub fn contribution(&self, compat: &CompatId, seq: u64, slot: u64) -> String {
        format!("{}/contrib/{compat}/{seq}/{slot}", self.namespace)
    }

    /// Prefix of every contribution of every compat id.
    pub fn all_contributions_prefix(&self) -> String {
        format!("{}/contrib/", self.namespace)
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

    /// A policy module (WebAssembly component bytes) by its blake3, the digest manifests record
    /// (`Manifest.policy.digest`): see `modules`.
    pub fn module(&self, digest: &ContentHash) -> String {
        format!("{}/module/{digest}", self.namespace)
    }

    pub fn modules_prefix(&self) -> String {
        format!("{}/module/", self.namespace)
    }

    pub fn pin(&self, id: &GenerationId) -> String {
        format!("{}/pin/{id}", self.namespace)
    }
}
