//! The survey: every compat id the store holds, its heads and generations with sizes, ages, pins
//! and who signed each (judged with the caller's `TrustPolicy`).

use std::collections::HashMap;

use serde::Serialize;

use crate::catalog::KeyLayout;
use crate::catalog::{self, FloorRecord, ManifestRead};
use crate::generation::{
    CompatId, GenerationId, HeadRecord, Manifest, PackRef, PolicyRef, Producer,
};
use crate::store::Store;
use crate::trust::{Signer, TrustPolicy};

use super::{InspectError, is_zero};

/// A generation as seen through its head records.
#[derive(Debug, Clone, Serialize)]
pub struct GenerationView {
    pub id: GenerationId,
    /// Head seqs pointing at it, newest first.
    pub seqs: Vec<u64>,
    /// When its newest head was written.
    pub head_written_at: u64,
    /// When a newer head of the same compat id that supersedes it was first written (None for the
    /// newest): under trust mode `required` only a trusted head supersedes (installs here take no
    /// other), and a time only a trusted key vouches for is taken as claimed (see
    /// `supersession_time`), so an attacker's backdated head never shortens gc's grace.
    pub superseded_at: Option<u64>,
    /// The seq of the head `superseded_at` came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<u64>,
    pub is_head: bool,
    pub pinned: bool,
    /// Who signed each head pointing at it, newest first.
    pub signatures: Vec<SeqSigner>,
    pub state: ManifestState,
}

/// Who signed the head at `seq`.
#[derive(Debug, Clone, Serialize)]
pub struct SeqSigner {
    pub seq: u64,
    pub signer: Signer,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum ManifestState {
    Present(Box<ManifestSummary>),
    /// The head points at a manifest the store no longer has (evicted or removed).
    Missing,
    Corrupt {
        error: String,
    },
}

#[derive(Debug, Clone, Serialize)]
pub struct ManifestSummary {
    pub created_at: u64,
    pub file_count: u64,
    pub size_bytes: u64,
    pub packed_bytes: u64,
    pub producer: Producer,
    pub policy: PolicyRef,
    pub parent: Option<GenerationId>,
    pub merged: Vec<GenerationId>,
    pub packs: Vec<PackRef>,
    /// Whether the root it was published from was a complete cache for its kind.
    pub complete: bool,
    /// Why not, in the policy's words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
}

impl ManifestSummary {
    fn of(m: &Manifest) -> Self {
        Self {
            created_at: m.created_at,
            file_count: m.files.len() as u64,
            size_bytes: m.total_bytes(),
            packed_bytes: m.packed_bytes(),
            producer: m.producer.clone(),
            policy: m.policy.clone(),
            parent: m.parent,
            merged: m.merged.clone(),
            packs: m.packs.clone(),
            complete: m.incomplete.is_none(),
            incomplete: m.incomplete.clone(),
        }
    }
}

impl GenerationView {
    pub fn summary(&self) -> Option<&ManifestSummary> {
        match &self.state {
            ManifestState::Present(s) => Some(s),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CompatView {
    pub compat_id: CompatId,
    /// From the newest readable manifest (None if none is readable).
    pub cache_kind: Option<String>,
    pub compat_key: Option<String>,
    pub floor: Option<FloorRecord>,
    /// Head records that exist but cannot be used (corrupt, oversized, another place's), each
    /// with why: anyone can write the store; readers pass them over.
    /// The newest `catalog::MAX_FAULTY_LISTED` of them; `faulty_count` counts all.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub faulty_heads: Vec<catalog::FaultyHead>,
    #[serde(skip_serializing_if = "is_zero")]
    pub faulty_count: u64,
    /// Newest first (by newest head seq).
    pub generations: Vec<GenerationView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Survey {
    pub namespace: String,
    pub compats: Vec<CompatView>,
}

impl Survey {
    pub fn generations(&self) -> impl Iterator<Item = (&CompatView, &GenerationView)> {
        self.compats
            .iter()
            .flat_map(|c| c.generations.iter().map(move |g| (c, g)))
    }
}

/// Walks every compat id, its heads and their manifests. Reads heads and manifests only (no packs).
/// Signatures are judged with `trust` (only shown: nothing here depends on them).
pub fn survey(
    store: &dyn Store,
    layout: &KeyLayout,
    trust: &TrustPolicy,
) -> Result<Survey, InspectError> {
    let mut compats = Vec::new();
    for compat in catalog::compat_ids(store, layout)? {
        compats.push(survey_compat(store, layout, &compat, trust)?);
    }
    Ok(Survey {
        namespace: layout.namespace().to_owned(),
        compats,
    })
}

pub fn survey_compat(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
    trust: &TrustPolicy,
) -> Result<CompatView, InspectError> {
    let catalog::CompatHeads {
        floor,
        heads,
        faulty,
        faulty_count,
    } = catalog::all_heads(store, layout, compat)?;
    let mut view = CompatView {
        compat_id: *compat,
        cache_kind: None,
        compat_key: None,
        floor,
        faulty_heads: faulty,
        faulty_count,
        generations: vec![],
    };
    // heads are newest first; a head's generation is superseded when the next newer head that
    // supersedes it (see `superseded_at`) was written: (seq, time) of that head.
    let mut by_id: HashMap<GenerationId, usize> = HashMap::new();
    let mut newer: Option<(u64, u64)> = None;
    for (i, h) in heads.iter().enumerate() {
        let superseded_at = newer.map(|(_, t)| t);
        let superseded_by = newer.map(|(s, _)| s);
        let signed = SeqSigner {
            seq: h.seq,
            signer: trust.judge(layout.namespace(), h),
        };
        if admitted(trust, &signed.signer) {
            newer = Some((h.seq, supersession_time(store, layout, h, &signed.signer)?));
        }
        match by_id.get(&h.generation) {
            Some(&idx) => {
                let g = &mut view.generations[idx];
                g.seqs.push(h.seq);
                g.signatures.push(signed);
                // The oldest supersession counts: an install may have read it from then on.
                if let Some(s) = superseded_at
                    && g.superseded_at.is_none_or(|x| s < x)
                {
                    g.superseded_at = Some(s);
                    g.superseded_by = superseded_by;
                }
            }
            None => {
                let state = match catalog::read_manifest(store, layout, &h.generation)? {
                    ManifestRead::Present(m) => {
                        if view.cache_kind.is_none() {
                            view.cache_kind = Some(m.cache_kind.clone());
                            view.compat_key = Some(m.compat_key.clone());
                        }
                        ManifestState::Present(Box::new(ManifestSummary::of(&m)))
                    }
                    ManifestRead::Missing => ManifestState::Missing,
                    ManifestRead::Unreadable(source) => ManifestState::Corrupt {
                        error: source.to_string(),
                    },
                };
                by_id.insert(h.generation, view.generations.len());
                view.generations.push(GenerationView {
                    id: h.generation,
                    seqs: vec![h.seq],
                    head_written_at: h.written_at,
                    superseded_at,
                    superseded_by,
                    is_head: i == 0,
                    pinned: catalog::is_pinned(store, layout, &h.generation)?,
                    signatures: vec![signed],
                    state,
                });
            }
        }
    }
    Ok(view)
}

/// Whether the trust admits acting on a head judged `signer` (superseding, deciding, condemning):
/// any head under modes `off` and `warn`, only a trusted key's under `required`.
pub fn admitted(trust: &TrustPolicy, signer: &Signer) -> bool {
    trust.mode() != crate::trust::TrustMode::Required || matches!(signer, Signer::Trusted { .. })
}

/// When `head` was written, as far as gc may rely on it: a trusted head's claim; for any other,
/// the later of its claim and the store's own write time where the store dates keys (an
/// unsigned head's `written_at` is whatever its writer says, and backdating it would cancel the
/// grace of the generation it supersedes). On a store that dates nothing the claim stands, and gc
/// reports that an unsigned record decided.
pub(super) fn supersession_time(
    store: &dyn Store,
    layout: &KeyLayout,
    head: &HeadRecord,
    signer: &Signer,
) -> Result<u64, InspectError> {
    if matches!(signer, Signer::Trusted { .. }) || !store.capabilities().write_times {
        return Ok(head.written_at);
    }
    let dated = store
        .modified(&layout.head(&head.compat_id, head.seq))?
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    Ok(head.written_at.max(dated))
}
