//! Verifying generations against their manifests (every pack fetched, every file hash checked),
//! and `Repairer`, which removes packs whose bytes do not match so the next publish uploads them
//! again.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::catalog::KeyLayout;
use crate::catalog::{self, ManifestRead};
use crate::generation::{
    ContentHash, ContentHasher, GenerationId, Manifest, PackRef, slices_by_pack,
};
use crate::store::Store;
use crate::trust::{Signer, TrustPolicy};

use super::InspectError;
use super::survey::{GenerationView, SeqSigner, Survey, admitted};

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
pub(super) fn check_packs(
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
pub(super) fn fetch_pack(
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
pub(super) fn blamed(v: &Verification) -> Vec<ContentHash> {
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
pub(super) fn vouched(v: &Verification) -> HashSet<ContentHash> {
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
