//! What the store holds, for operators and for gc: every compat id (from the compat index, plus
//! listing where the store can), its heads and generations with sizes, ages and pins; one
//! generation in detail with its parent chain; and verification of generations against their
//! manifests (every pack fetched, every file hash checked), and `repair`, which removes packs
//! whose bytes do not match so the next publish uploads them again. Who signed each head is judged
//! with the caller's `TrustPolicy`. Works on stores without listing.
//!
//! Survey, show, verify and repair share their readers (the index walk, the tolerant
//! manifest fetch, the per-pack check), which is why they live in one module.

pub mod tiers;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::catalog::KeyLayout;
use crate::catalog::{self, CatalogError, FloorRecord, ManifestRead};
use crate::generation::{
    CompatId, ContentHash, ContentHasher, GenerationId, HeadRecord, Manifest, PackRef, PolicyRef,
    Producer, slices_by_pack,
};
use crate::store::{Store, StoreError};
use crate::trust::{Signer, TrustPolicy};

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
fn supersession_time(
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

// ---------------------------------------------------------------------------------------------
// verify

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "problem", rename_all = "kebab-case")]
pub enum Problem {
    ManifestMissing,
    ManifestCorrupt {
        error: String,
    },
    PackMissing {
        pack: ContentHash,
    },
    PackSize {
        pack: ContentHash,
        expected: u64,
        actual: u64,
    },
    FileCorrupt {
        path: String,
        expected: ContentHash,
        actual: ContentHash,
        /// The packs holding its bytes (one of them is damaged).
        packs: Vec<ContentHash>,
    },
    /// The trust in force refuses the head at `seq` (see `signature_problems`).
    Untrusted {
        seq: u64,
        signer: Signer,
    },
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ManifestMissing => write!(f, "manifest missing (evicted or removed)"),
            Self::ManifestCorrupt { error } => write!(f, "manifest corrupt: {error}"),
            Self::PackMissing { pack } => write!(f, "pack {pack} missing (evicted or removed)"),
            Self::PackSize {
                pack,
                expected,
                actual,
            } => write!(
                f,
                "pack {pack} is {actual} bytes, the manifest says {expected}"
            ),
            Self::Untrusted { seq, signer } => write!(f, "head {seq} is {signer}"),
            Self::FileCorrupt {
                path,
                expected,
                actual,
                ..
            } => write!(
                f,
                "file {path}: content hashes to {actual}, the manifest says {expected}"
            ),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Verification {
    pub generation: GenerationId,
    pub ok: bool,
    pub files_checked: u64,
    pub packs_fetched: u64,
    pub bytes_fetched: u64,
    pub problems: Vec<Problem>,
    /// Who signed the heads pointing at it (filled by the caller, from a survey).
    pub signatures: Vec<SeqSigner>,
    /// Damaged packs removed by `repair`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub repaired: Vec<ContentHash>,
    /// Why `repair` left packs this verification blames (see `Repairer`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub repair_refused: Vec<String>,
    /// The packs its manifest references (empty when the manifest could not be read).
    #[serde(skip)]
    pub checked_packs: Vec<ContentHash>,
}

impl Verification {
    /// A verification of `id` that found nothing yet.
    pub fn empty(id: GenerationId) -> Self {
        Self {
            generation: id,
            ok: false,
            files_checked: 0,
            packs_fetched: 0,
            bytes_fetched: 0,
            problems: vec![],
            signatures: vec![],
            repaired: vec![],
            repair_refused: vec![],
            checked_packs: vec![],
        }
    }
}

/// Fetches every pack of `id` (one at a time: memory stays at one pack plus the hashers) and
/// checks every pack size and every file's blake3. Problems are reported, not returned as errors;
/// errors are for a store that cannot be asked.
pub fn verify(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
) -> Result<Verification, InspectError> {
    let mut v = Verification {
        generation: *id,
        ok: false,
        files_checked: 0,
        packs_fetched: 0,
        bytes_fetched: 0,
        problems: vec![],
        signatures: vec![],
        repaired: vec![],
        repair_refused: vec![],
        checked_packs: vec![],
    };
    let manifest = match catalog::read_manifest(store, layout, id)? {
        ManifestRead::Present(m) => *m,
        ManifestRead::Missing => {
            v.problems.push(Problem::ManifestMissing);
            return Ok(v);
        }
        ManifestRead::Unreadable(source) => {
            v.problems.push(Problem::ManifestCorrupt {
                error: source.to_string(),
            });
            return Ok(v);
        }
    };
    check_packs(store, layout, &manifest, &mut v)?;
    Ok(v)
}

/// [`verify`] of a manifest already read (`id` names it in the result), or of part of one (a
/// publish checking only the packs it copied between tiers).
pub fn verify_manifest(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
    manifest: &Manifest,
) -> Result<Verification, InspectError> {
    let mut v = Verification::empty(*id);
    check_packs(store, layout, manifest, &mut v)?;
    Ok(v)
}

/// Fetches every pack of `manifest` and checks sizes and file hashes into `v`.
fn check_packs(
    store: &dyn Store,
    layout: &KeyLayout,
    manifest: &Manifest,
    v: &mut Verification,
) -> Result<(), InspectError> {
    v.checked_packs = manifest.packs.iter().map(|p| p.id).collect();
    // Per file: a hasher fed in chunk order. Chunks are visited pack by pack, so a file whose
    // chunks go back to an earlier pack is re-checked on its own afterwards.
    let by_pack = slices_by_pack(&manifest.files);
    let mut hashers: Vec<(ContentHasher, usize)> = manifest
        .files
        .iter()
        .map(|_| (ContentHasher::new(), 0))
        .collect();
    let mut broken = vec![false; manifest.files.len()];
    let mut out_of_order: Vec<usize> = Vec::new();
    for (pi, pack) in manifest.packs.iter().enumerate() {
        let Some(bytes) = fetch_pack(store, layout, pack, v)? else {
            for s in by_pack.get(&(pi as u32)).into_iter().flatten() {
                broken[s.file] = true;
            }
            continue;
        };
        for s in by_pack.get(&(pi as u32)).into_iter().flatten() {
            let (hasher, next) = &mut hashers[s.file];
            if *next != s.chunk {
                if !out_of_order.contains(&s.file) {
                    out_of_order.push(s.file);
                }
                continue;
            }
            hasher.update(s.of(&bytes));
            *next += 1;
        }
    }
    for fi in out_of_order {
        if broken[fi] {
            continue;
        }
        let mut hasher = ContentHasher::new();
        for c in &manifest.files[fi].chunks {
            let pack = &manifest.packs[c.pack as usize];
            match fetch_pack(store, layout, pack, v)? {
                Some(bytes) => {
                    hasher.update(&bytes[c.offset as usize..(c.offset + c.len) as usize]);
                }
                None => {
                    broken[fi] = true;
                    break;
                }
            }
        }
        hashers[fi] = (hasher, manifest.files[fi].chunks.len());
    }
    for (fi, f) in manifest.files.iter().enumerate() {
        if broken[fi] {
            continue;
        }
        v.files_checked += 1;
        let actual: ContentHash = hashers[fi].0.finish();
        if actual != f.blake3 {
            let mut packs: Vec<ContentHash> = f
                .chunks
                .iter()
                .map(|c| manifest.packs[c.pack as usize].id)
                .collect();
            packs.dedup();
            v.problems.push(Problem::FileCorrupt {
                path: f.path.to_string(),
                expected: f.blake3,
                actual,
                packs,
            });
        }
    }
    v.ok = v.problems.is_empty();
    Ok(())
}

/// A pack's bytes if present and of the manifest's size; otherwise records the problem. Read
/// under the manifest's size as a cap: anyone can put a pack key, and a planted value far larger
/// than the pack must not cost verify (or a publish checking its parent) its memory.
fn fetch_pack(
    store: &dyn Store,
    layout: &KeyLayout,
    pack: &PackRef,
    v: &mut Verification,
) -> Result<Option<Vec<u8>>, InspectError> {
    let fetched = match store.get_capped(&layout.pack(&pack.id), pack.size) {
        Err(crate::store::StoreError::TooLarge { size, .. }) => {
            let p = Problem::PackSize {
                pack: pack.id,
                expected: pack.size,
                actual: size,
            };
            if !v.problems.contains(&p) {
                v.problems.push(p);
            }
            return Ok(None);
        }
        other => other?,
    };
    let Some(bytes) = fetched else {
        let p = Problem::PackMissing { pack: pack.id };
        if !v.problems.contains(&p) {
            v.problems.push(p);
        }
        return Ok(None);
    };
    v.packs_fetched += 1;
    v.bytes_fetched += bytes.len() as u64;
    if bytes.len() as u64 != pack.size {
        let p = Problem::PackSize {
            pack: pack.id,
            expected: pack.size,
            actual: bytes.len() as u64,
        };
        if !v.problems.contains(&p) {
            v.problems.push(p);
        }
        return Ok(None);
    }
    Ok(Some(bytes))
}

/// `Untrusted` problems for the heads of `g` that `trust` refuses (none under mode `off`).
pub fn signature_problems(g: &GenerationView, trust: &TrustPolicy) -> Vec<Problem> {
    if trust.mode() == crate::trust::TrustMode::Off {
        return vec![];
    }
    g.signatures
        .iter()
        .filter(|s| !matches!(s.signer, Signer::Trusted { .. }))
        .map(|s| Problem::Untrusted {
            seq: s.seq,
            signer: s.signer.clone(),
        })
        .collect()
}

/// The packs `v` blames: wrong size, or holding a file whose bytes do not hash to the manifest's.
fn blamed(v: &Verification) -> Vec<ContentHash> {
    let mut damaged: Vec<ContentHash> = Vec::new();
    for p in &v.problems {
        match p {
            Problem::PackSize { pack, .. } => damaged.push(*pack),
            Problem::FileCorrupt { packs, .. } => damaged.extend(packs),
            _ => {}
        }
    }
    damaged.sort();
    damaged.dedup();
    damaged
}

/// The packs `v` checked and found whole: fetched, of its manifest's size, every file of it that
/// they hold hashing right.
fn vouched(v: &Verification) -> HashSet<ContentHash> {
    let bad: HashSet<ContentHash> = blamed(v)
        .into_iter()
        .chain(v.problems.iter().filter_map(|p| match p {
            Problem::PackMissing { pack } => Some(*pack),
            _ => None,
        }))
        .collect();
    v.checked_packs
        .iter()
        .filter(|p| !bad.contains(p))
        .copied()
        .collect()
}

/// Removes damaged packs, judging by trust: anyone can write a manifest claiming any hashes for
/// any pack, so a pack is condemned only on the word of a manifest the trust admits (a head of it
/// is `admitted`), and never while another admitted generation verifies it. Puts never
/// overwrite, so a poisoned or torn pack would otherwise stay forever; once removed, the next
/// publish of a root holding those files uploads the pack again (a parent whose packs are gone
/// is used without their files), and installs fall back meanwhile. Missing packs and manifests
/// are left to gc and the next publish.
pub struct Repairer<'a> {
    store: &'a dyn Store,
    layout: &'a KeyLayout,
    survey: &'a Survey,
    trust: &'a TrustPolicy,
    /// Admitted generations verified so far, with the packs each vouches for (`vouched`).
    verified: HashMap<GenerationId, HashSet<ContentHash>>,
}

/// What one repair did: the packs removed, and why others `v` blames were not.
#[derive(Debug, Clone, Default)]
pub struct Repair {
    pub removed: Vec<ContentHash>,
    pub refused: Vec<String>,
}

impl<'a> Repairer<'a> {
    pub fn new(
        store: &'a dyn Store,
        layout: &'a KeyLayout,
        survey: &'a Survey,
        trust: &'a TrustPolicy,
    ) -> Self {
        Self {
            store,
            layout,
            survey,
            trust,
            verified: HashMap::new(),
        }
    }

    /// Whether a head of generation `id` is one the trust admits (a manifest no head names counts
    /// only where every head would: trust mode `off` or `warn`).
    fn admits(&self, id: &GenerationId) -> bool {
        let mut heads = self
            .survey
            .generations()
            .filter(|(_, g)| g.id == *id)
            .flat_map(|(_, g)| g.signatures.iter())
            .peekable();
        if heads.peek().is_none() {
            return self.trust.mode() != crate::trust::TrustMode::Required;
        }
        heads.any(|s| admitted(self.trust, &s.signer))
    }

    /// Removes the packs `v` blames, as far as the trust allows (see `Repairer`).
    pub fn repair(&mut self, v: &Verification) -> Result<Repair, InspectError> {
        let mut out = Repair::default();
        let damaged = blamed(v);
        if damaged.is_empty() {
            return Ok(out);
        }
        if !self.admits(&v.generation) {
            out.refused.push(format!(
                "generation {} is not admitted by the trust in force (no head of it is signed by                  a trusted key): its manifest condemns no pack; remove its head and manifest if                  it is not yours",
                v.generation
            ));
            return Ok(out);
        }
        for pack in damaged {
            if let Some(other) = self.verified_by(&pack, &v.generation)? {
                out.refused.push(format!(
                    "pack {pack}: generation {other} (admitted) verifies it, so the fault is in                      the manifest of {}, not in the pack; not removed",
                    v.generation
                ));
                continue;
            }
            // Mooncake refuses to remove a key read in the last seconds (verify just read it).
            if catalog::remove_one(
                self.store,
                &self.layout.pack(&pack),
                catalog::LeaseWait::ONE_KEY,
            )? {
                out.removed.push(pack);
            }
        }
        Ok(out)
    }

    /// An admitted generation other than `besides` that references `pack` and verifies it.
    fn verified_by(
        &mut self,
        pack: &ContentHash,
        besides: &GenerationId,
    ) -> Result<Option<GenerationId>, InspectError> {
        let mut candidates: Vec<GenerationId> = self
            .survey
            .generations()
            .filter(|(_, g)| g.id != *besides)
            .filter(|(_, g)| {
                g.summary()
                    .is_some_and(|s| s.packs.iter().any(|p| p.id == *pack))
            })
            .map(|(_, g)| g.id)
            .collect();
        candidates.sort();
        candidates.dedup();
        for id in candidates {
            if !self.admits(&id) {
                continue;
            }
            if !self.verified.contains_key(&id) {
                let v = verify(self.store, self.layout, &id)?;
                self.verified.insert(id, vouched(&v));
            }
            if self.verified[&id].contains(pack) {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }
}

pub(crate) fn is_zero(n: &u64) -> bool {
    *n == 0
}
