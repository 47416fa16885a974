//! What the store holds, for operators and for gc: every compat id (from the compat index, plus
//! listing where the store can), its heads and generations with sizes, ages and pins; one
//! generation in detail with its parent chain; and verification of generations against their
//! manifests (every pack fetched, every file hash checked), and `repair`, which removes packs
//! whose bytes do not match so the next publish uploads them again. Who signed each head is judged
//! with the caller's `TrustPolicy`. Works on stores without listing.
//!
//! Survey, show, verify and repair share their readers (the index walk, the tolerant
//! manifest fetch, the per-pack check), which is why they live under one module: the survey in
//! `survey`, verification and repair in `verify`, one generation in detail here.

mod survey;
pub mod tiers;
mod verify;

pub use survey::{
    CompatView, GenerationView, ManifestState, ManifestSummary, SeqSigner, Survey, admitted,
    survey, survey_compat,
};
pub use verify::{
    Problem, Repair, Repairer, Verification, signature_problems, verify, verify_manifest,
};

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use crate::catalog::KeyLayout;
use crate::catalog::{self, CatalogError, ManifestRead};
use crate::generation::{CompatId, ContentHash, GenerationId, PolicyRef, Producer};
use crate::store::{Store, StoreError};
use crate::trust::TrustPolicy;

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no generation matches {0:?}; run `jitship ls` to see the generations and their ids")]
    NotFound(String),
    #[error("{0:?} matches several generations ({1}); give more digits")]
    Ambiguous(String, String),
    #[error(
        "{0:?} is not a generation id: give the 64-digit id or a prefix of at least 8 hex digits"
    )]
    BadId(String),
}

/// A generation id from a full id or a unique prefix (at least 8 hex digits) of a generation a
/// head points at.
pub fn resolve(
    store: &dyn Store,
    layout: &KeyLayout,
    text: &str,
) -> Result<GenerationId, InspectError> {
    if let Ok(id) = text.parse::<GenerationId>() {
        return Ok(id);
    }
    if text.len() < 8 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(InspectError::BadId(text.to_owned()));
    }
    let prefix = text.to_ascii_lowercase();
    let survey = survey(store, layout, &TrustPolicy::default())?;
    let mut found: Vec<GenerationId> = survey
        .generations()
        .map(|(_, g)| g.id)
        .filter(|id| id.to_string().starts_with(&prefix))
        .collect();
    found.sort();
    found.dedup();
    match found.len() {
        0 => Err(InspectError::NotFound(text.to_owned())),
        1 => Ok(found[0]),
        _ => Err(InspectError::Ambiguous(
            text.to_owned(),
            found
                .iter()
                .map(|g| g.to_string()[..12].to_owned())
                .collect::<Vec<_>>()
                .join(", "),
        )),
    }
}

/// One generation in detail.
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    pub id: GenerationId,
    pub cache_kind: String,
    pub compat_key: String,
    pub compat_id: CompatId,
    pub facts: BTreeMap<String, String>,
    pub policy: PolicyRef,
    pub producer: Producer,
    pub created_at: u64,
    pub file_count: u64,
    pub size_bytes: u64,
    pub packed_bytes: u64,
    pub pack_count: u64,
    /// Whether the root it was published from was a complete cache for its kind.
    pub complete: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    pub pinned: Option<catalog::PinRecord>,
    /// Head seqs pointing at this generation.
    pub heads: Vec<u64>,
    /// Who signed each of those heads.
    pub signatures: Vec<SeqSigner>,
    pub is_head: bool,
    pub merged: Vec<GenerationId>,
    /// Parent, grandparent, ... as far as manifests remain (at most `MAX_CHAIN`).
    pub parent_chain: Vec<ChainLink>,
    pub files: Vec<FileLine>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChainLink {
    pub id: GenerationId,
    /// None when the manifest is gone (collected or evicted): the chain ends there.
    pub created_at: Option<u64>,
    pub file_count: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FileLine {
    pub path: String,
    pub size: u64,
    pub blake3: ContentHash,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub marker: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub canonical: bool,
}

pub const MAX_CHAIN: usize = 32;

pub fn inspect(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
    trust: &TrustPolicy,
) -> Result<Inspection, InspectError> {
    let manifest = catalog::fetch_manifest(store, layout, id)?
        .ok_or_else(|| InspectError::NotFound(id.to_string()))?;
    let view = survey_compat(store, layout, &manifest.compat_id, trust)?;
    let mine = view.generations.iter().find(|g| g.id == *id);
    let mut parent_chain = Vec::new();
    let mut next = manifest.parent;
    let mut seen = HashSet::new();
    while let Some(p) = next {
        if parent_chain.len() >= MAX_CHAIN || !seen.insert(p) {
            break;
        }
        match catalog::read_manifest(store, layout, &p)? {
            ManifestRead::Present(m) => {
                parent_chain.push(ChainLink {
                    id: p,
                    created_at: Some(m.created_at),
                    file_count: Some(m.files.len() as u64),
                });
                next = m.parent;
            }
            ManifestRead::Missing | ManifestRead::Unreadable(_) => {
                parent_chain.push(ChainLink {
                    id: p,
                    created_at: None,
                    file_count: None,
                });
                next = None;
            }
        }
    }
    Ok(Inspection {
        id: *id,
        cache_kind: manifest.cache_kind.clone(),
        compat_key: manifest.compat_key.clone(),
        compat_id: manifest.compat_id,
        facts: manifest.facts.clone(),
        policy: manifest.policy.clone(),
        producer: manifest.producer.clone(),
        created_at: manifest.created_at,
        file_count: manifest.files.len() as u64,
        size_bytes: manifest.total_bytes(),
        packed_bytes: manifest.packed_bytes(),
        pack_count: manifest.packs.len() as u64,
        complete: manifest.incomplete.is_none(),
        incomplete: manifest.incomplete.clone(),
        pinned: catalog::pin_record(store, layout, id)?,
        heads: mine.map(|g| g.seqs.clone()).unwrap_or_default(),
        signatures: mine.map(|g| g.signatures.clone()).unwrap_or_default(),
        is_head: mine.is_some_and(|g| g.is_head),
        merged: manifest.merged.clone(),
        parent_chain,
        files: manifest
            .files
            .iter()
            .map(|f| FileLine {
                path: f.path.to_string(),
                size: f.size,
                blake3: f.blake3,
                marker: f.marker,
                canonical: f.canonical,
            })
            .collect(),
    })
}

pub(crate) fn is_zero(n: &u64) -> bool {
    *n == 0
}
