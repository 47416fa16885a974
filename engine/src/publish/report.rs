//! What a publish is given and what it returns: options, the report and outcome, skip details
//! and errors (re-exported from `crate::publish`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::catalog::CatalogError;
use crate::facts::Facts;
use crate::generation::{CompatId, Conflict, GenerationId, Producer, RelPath};
use crate::interrupt::Interrupt;
use crate::policy::{PolicyError, ReasonCategory};
use crate::store::StoreError;
use crate::trust::PublishTrust;

#[derive(Debug, Clone)]
pub struct PublishOptions {
    pub pack_size: u64,
    pub producer: Producer,
    pub facts: Facts,
    /// Head seqs to try before giving up when other publishers keep winning.
    pub max_head_attempts: u32,
    /// The key heads are signed with, and which heads may be built on and merged.
    pub trust: PublishTrust,
    /// Raised (by SIGTERM or SIGINT in the CLI), it stops the publish before its next file or
    /// pack, and always before the head: nothing of a stopped publish is visible.
    pub interrupt: Interrupt,
    /// The durable registry tier (`[store.durable] registry`): the newest trusted generation is
    /// pushed there after each publish that leaves a head.
    pub registry: Option<std::sync::Arc<crate::oci::Registry>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum PublishOutcome {
    /// A new generation is the head.
    Published { generation: GenerationId, seq: u64 },
    /// The head already holds every selected file.
    Unchanged { generation: GenerationId },
    /// Nothing publishable under the root and no head yet.
    Empty,
}

#[derive(Debug, Clone, Serialize)]
pub struct PublishReport {
    pub cache_kind: String,
    pub root: PathBuf,
    pub compat_key: String,
    pub compat_id: CompatId,
    #[serde(flatten)]
    pub outcome: PublishOutcome,
    pub files_selected: u64,
    /// Files not published, by category (`ReasonCategory`: a small fixed set, so summaries and
    /// metric labels stay bounded whatever the tree holds).
    pub skipped: BTreeMap<ReasonCategory, u64>,
    /// Which files were skipped and why in words: the first `MAX_SKIP_DETAILS` of them, for `-v`
    /// and reports (never for metric labels).
    pub skip_details: Vec<SkipDetail>,
    /// Why the root is not a complete cache for its kind (the policy's `incomplete-detail`); the
    /// generation published from it is recorded as incomplete. `None` = complete.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// Selected files the parent generation did not have.
    pub files_new: u64,
    pub files_hashed: u64,
    pub bytes_uploaded: u64,
    /// Bytes of packs this publish needed that the store already held (other pods, crashed runs).
    pub bytes_deduplicated: u64,
    pub packs_uploaded: u64,
    pub packs_reused: u64,
    pub conflicts: Vec<Conflict>,
    /// Generations of other publishers merged in because they won a head seq first, or left
    /// contributions at a seq this publish lost.
    pub merged: Vec<GenerationId>,
    /// Heads this publish put (1 without a race; a loser waiting to be carried reads heads
    /// instead), and contributions it left: a publisher's share of a race's cost.
    pub head_attempts: u32,
    pub contributions: u32,
    /// The head this publish ends on is another publisher's that carried its files (it put no
    /// head of its own that stands).
    pub carried: bool,
    /// Key id of the key the new head was signed with (None: unsigned).
    pub signed_by: Option<String>,
    /// Who signed the head this publish built on (None: no parent).
    pub parent_signer: Option<crate::trust::Signer>,
    /// Time spent hashing files, and reading and uploading packs (where a publish's time goes).
    pub hash_ms: u64,
    pub upload_ms: u64,
    pub duration_ms: u64,
    /// With a durable registry tier: what was pushed there, or why nothing could be.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registry: Option<RegistryPush>,
    /// Why the policy module could not be stored by its digest (`catalog::modules`); gc keeps
    /// the key whole until it has a module of that digest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module_not_stored: Option<String>,
    /// The policy this publish ran with and the settings it recorded (name, version, digest,
    /// settings).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<crate::generation::PolicyRef>,
    /// Sticky settings: no settings were given for the cache, so the settings the key's newest
    /// generation (this id) recorded were kept, not reset to the defaults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settings_kept_from: Option<crate::generation::GenerationId>,
    /// Why the recorded settings could not be kept (the module refuses them, or they give
    /// another key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settings_note: Option<String>,
}

impl PublishReport {
    pub(super) fn new(
        cache_kind: String,
        root: &Path,
        compat_key: String,
        compat_id: CompatId,
        selection: &super::select::Chosen,
    ) -> Self {
        Self {
            cache_kind,
            root: root.into(),
            compat_key,
            compat_id,
            outcome: PublishOutcome::Empty,
            files_selected: selection.files.len() as u64,
            skipped: selection.skipped.clone(),
            skip_details: selection.skip_details.clone(),
            incomplete: selection.incomplete.clone(),
            files_new: 0,
            files_hashed: 0,
            bytes_uploaded: 0,
            bytes_deduplicated: 0,
            packs_uploaded: 0,
            packs_reused: 0,
            conflicts: vec![],
            merged: vec![],
            head_attempts: 0,
            contributions: 0,
            carried: false,
            signed_by: None,
            parent_signer: None,
            hash_ms: 0,
            upload_ms: 0,
            duration_ms: 0,
            registry: None,
            module_not_stored: None,
            policy: None,
            settings_kept_from: None,
            settings_note: None,
        }
    }
}

/// A publish's push to the durable registry tier.
#[derive(Debug, Clone, Serialize)]
pub struct RegistryPush {
    pub registry: String,
    /// What was pushed (`outcome` says `pushed to ...` or `already-present`); `None` with an
    /// error, or when the store held no whole generation the publisher trusts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<crate::oci::BakedGeneration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The push after the publish (its packs were pushed while it uploaded them, in
    /// `upload_ms`).
    pub duration_ms: u64,
}

/// Most skipped files `PublishReport::skip_details` lists (the counts by category are complete).
pub const MAX_SKIP_DETAILS: usize = 100;

/// One skipped file, for `-v` and reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkipDetail {
    pub path: String,
    pub category: ReasonCategory,
    pub detail: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("policy {policy}: {source}")]
    Policy { policy: String, source: PolicyError },
    #[error("policy {0} returned {1} decisions for {2} files")]
    PolicyContract(String, usize, usize),
    #[error("scanning {root}: {source}")]
    Scan {
        root: PathBuf,
        source: std::io::Error,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The policy refused or failed to give the root-independent form of a file it said embeds
    /// the root.
    #[error("policy could not canonicalize {path}: {source}")]
    Canonicalize { path: RelPath, source: PolicyError },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(
        "gave up after {0} attempts to write a head: other publishers kept winning; retry later"
    )]
    Contention(u32),
    #[error(
        "wrote the head at seq {seq}, but an install would not reach it: {passed} head records \
         above it that installs pass over were written meanwhile (anyone can write the store); \
         publish again with a signing key under trust mode required (it removes them), or run \
         `jitship gc`"
    )]
    Unreachable { seq: u64, passed: usize },
    #[error(
        "removed {removed} head records this publisher's trust refuses near the top of the seq \
         range (someone flooded the store; trust mode required), and more remain: nothing was \
         published; publish again to go on clearing"
    )]
    Flooded { removed: usize },
    #[error(
        "trust mode is required but no signing key is configured: set trust.signing_key_file, \
         --signing-key or JITSHIP_SIGNING_KEY_FILE (make a key with `jitship key generate`), or \
         every generation this publisher writes would be refused"
    )]
    NoSigningKey,
    /// The new generation's manifest is over what the store takes as one value or readers
    /// accept (`publish::check_manifest_fits`); found before anything was written.
    #[error(
        "nothing was published: the generation's manifest would be {size} bytes for {files} \
         files, over the {limit}-byte limit {limit_of} (about {files_that_fit} files of these); \
         {what_to_do}"
    )]
    ManifestTooLarge {
        files: u64,
        size: u64,
        limit: u64,
        limit_of: String,
        files_that_fit: u64,
        what_to_do: String,
    },
    #[error(
        "nothing was published: the pack size ({pack_size} bytes) is over the largest value \
         {store} takes ({limit} bytes); lower publish.pack_size (or --pack-size) to at most that"
    )]
    PackSizeOverLimit {
        pack_size: u64,
        limit: u64,
        store: String,
    },
    #[error("cache root {0} does not exist: check the path (or the volume mount)")]
    RootMissing(PathBuf),
    #[error("cache root {0} is not a directory")]
    RootNotDir(PathBuf),
    #[error(
        "{0}: stopped before writing a head, so nothing was published (packs already uploaded \
         are reused by the next publish)"
    )]
    Interrupted(&'static str),
}
