//! `verify` of a store of two tiers (`TieredStore`): each tier is checked on its own, so one that
//! lacks what the other holds (a durable tier added to a store that already held generations, a
//! fast tier restarted empty or evicted, a durable directory that lost files) is named instead of
//! hidden by reads that fall through; and `--repair` fills each tier from the other with what
//! checks, for generations the trust admits.
//!
//! Filling copies bytes only after they checked in the tier they come from, and checks them again
//! where they land (a pack's files hash to the manifest's; a manifest decodes to its id; a head
//! names the generation and its signer is admitted), in publish's order: packs, then the
//! manifest, then the heads, and the heads only once the tier holds every pack and the manifest.

use std::collections::HashSet;

use serde::Serialize;

use super::verify::{blamed, vouched};
use super::{InspectError, Problem, Survey, Verification, admitted, verify};
use crate::catalog::{self, KeyLayout, ManifestRead};
use crate::generation::{ContentHash, GenerationId, HeadRecord, MAX_MANIFEST_BYTES, Manifest};
use crate::store::{Store, StoreError, ValueClass};
use crate::trust::TrustPolicy;

/// Which tier of a two-tier store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    Fast,
    Durable,
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Fast => "fast tier",
            Self::Durable => "durable tier",
        })
    }
}

/// One tier's verification of a generation.
#[derive(Debug, Clone, Serialize)]
pub struct TierCheck {
    pub tier: Tier,
    /// The tier's store, as it describes itself.
    pub store: String,
    /// Seqs of this tier's heads that name the generation, newest first.
    pub heads: Vec<u64>,
    /// Whether this tier holds the generation whole: its manifest, and every pack, each of its
    /// manifest's size, every file hashing right.
    pub ok: bool,
    /// What this tier lacks of it, or holds damaged. A problem of the generation when the tier
    /// announces it (a head here names it); otherwise only what a fill would copy (the other tier
    /// alone announces it: a durable tier added later, a fast tier restarted).
    pub problems: Vec<Problem>,
    pub files_checked: u64,
    pub packs_fetched: u64,
    pub bytes_fetched: u64,
    /// What `--repair` copied into this tier from the other (store keys).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub filled: Vec<String>,
    /// Why `--repair` left some of what this tier lacks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fill_refused: Vec<String>,
    #[serde(skip)]
    verification: Verification,
}

impl TierCheck {
    /// Whether a head of this tier names the generation (then what it lacks is a problem).
    pub fn announces(&self) -> bool {
        !self.heads.is_empty()
    }

    /// Whether this tier is as it should be for the generation: whole where it announces it.
    pub fn sound(&self) -> bool {
        self.ok || !self.announces()
    }
}

/// Each tier's heads that name `id`: `(compat id, seq)`, newest first.
pub fn heads_of(survey: &Survey, id: &GenerationId) -> Vec<(crate::generation::CompatId, u64)> {
    survey
        .generations()
        .filter(|(_, g)| g.id == *id)
        .flat_map(|(c, g)| g.seqs.iter().map(|s| (c.compat_id, *s)))
        .collect()
}

/// Verifies `id` in `store` (one tier) on its own; `heads` are its heads there.
pub fn check_tier(
    tier: Tier,
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
    heads: &[u64],
) -> Result<TierCheck, InspectError> {
    let v = verify(store, layout, id)?;
    Ok(TierCheck {
        tier,
        store: store.describe(),
        heads: heads.to_vec(),
        ok: v.problems.is_empty(),
        problems: v.problems.clone(),
        files_checked: v.files_checked,
        packs_fetched: v.packs_fetched,
        bytes_fetched: v.bytes_fetched,
        filled: vec![],
        fill_refused: vec![],
        verification: v,
    })
}

impl TierCheck {
    /// What `verify` found in this tier alone.
    pub fn verification(&self) -> &Verification {
        &self.verification
    }
}

/// `fast`'s verification narrowed to the packs both tiers hold damaged (wrong size, or files that
/// do not hash right): what no fill can mend, for `Repairer` to remove from both.
pub fn damaged_in_both(fast: &TierCheck, durable: &TierCheck) -> Verification {
    let other: HashSet<ContentHash> = blamed(&durable.verification).into_iter().collect();
    let mut v = fast.verification.clone();
    v.problems.retain(|p| match p {
        Problem::PackSize { pack, .. } => other.contains(pack),
        Problem::FileCorrupt { packs, .. } => packs.iter().all(|p| other.contains(p)),
        _ => false,
    });
    v
}

/// What a fill needs besides the two tiers' checks.
pub struct FillContext<'a> {
    pub layout: &'a KeyLayout,
    pub trust: &'a TrustPolicy,
    pub id: GenerationId,
    /// Heads naming the generation in the tier filled from: `(compat id, seq)`.
    pub from_heads: Vec<(crate::generation::CompatId, u64)>,
}

/// Fills tier `to` (checked as `to_check`) from `from` (checked as `from_check`) for the
/// generation: the packs `to` lacks or holds damaged that `from` verified, the manifest, and then,
/// once `to` holds all of it, the heads `from` has that `to` lacks (only heads the trust admits).
/// What was copied goes in `to_check.filled`, what could not in `to_check.fill_refused`. Errors are
/// for a store that cannot be asked.
pub fn fill(
    cx: &FillContext,
    from: &dyn Store,
    from_check: &TierCheck,
    to: &dyn Store,
    to_check: &mut TierCheck,
) -> Result<(), InspectError> {
    if to_check.ok && (to_check.announces() || cx.from_heads.is_empty()) {
        return Ok(());
    }
    let layout = cx.layout;
    let manifest = match catalog::read_manifest(from, layout, &cx.id)? {
        ManifestRead::Present(m) => *m,
        _ => {
            to_check.fill_refused.push(format!(
                "the {} has no readable manifest of it to copy",
                from_check.tier
            ));
            return Ok(());
        }
    };
    let good = vouched(&from_check.verification);
    let mut whole = true;

    // Packs.
    let to_v = &to_check.verification;
    let mut wanted: Vec<ContentHash> = blamed(to_v);
    if matches!(
        to_v.problems.first(),
        Some(Problem::ManifestMissing | Problem::ManifestCorrupt { .. })
    ) {
        // Nothing was checked there: every pack it lacks or holds at another size.
        for p in &manifest.packs {
            match to.size(&layout.pack(&p.id)) {
                Ok(Some(s)) if s == p.size => {}
                Ok(_) | Err(StoreError::Unsupported(_)) => wanted.push(p.id),
                Err(e) => return Err(e.into()),
            }
        }
    }
    wanted.extend(to_v.problems.iter().filter_map(|p| match p {
        Problem::PackMissing { pack } => Some(*pack),
        _ => None,
    }));
    wanted.sort();
    wanted.dedup();
    let mut copied = HashSet::new();
    for pack in &wanted {
        let Some(p) = manifest.packs.iter().find(|p| p.id == *pack) else {
            continue;
        };
        if !good.contains(pack) {
            to_check.fill_refused.push(format!(
                "pack {pack}: the {} does not hold it whole either",
                from_check.tier
            ));
            whole = false;
            continue;
        }
        let key = layout.pack(pack);
        // A damaged copy goes first: puts never overwrite.
        catalog::remove_one(to, &key, catalog::LeaseWait::ONE_KEY)?;
        match from.get_capped(&key, p.size)? {
            Some(bytes) if bytes.len() as u64 == p.size => {
                to.put(&key, &bytes, ValueClass::Bulk)?;
                copied.insert(*pack);
            }
            _ => {
                to_check.fill_refused.push(format!(
                    "pack {pack}: gone from the {} since it was verified",
                    from_check.tier
                ));
                whole = false;
            }
        }
    }
    // The copies are checked where they landed: the files they hold hash to the manifest's.
    if !copied.is_empty() {
        let mut touched = manifest.clone();
        touched.files.retain(|f| {
            f.chunks
                .iter()
                .any(|c| copied.contains(&manifest.packs[c.pack as usize].id))
        });
        crate::generation::prune_packs(&mut touched);
        let v = super::verify_manifest(to, layout, &cx.id, &touched)?;
        let bad: HashSet<ContentHash> = blamed(&v)
            .into_iter()
            .chain(v.problems.iter().filter_map(|p| match p {
                Problem::PackMissing { pack } => Some(*pack),
                _ => None,
            }))
            .filter(|p| copied.contains(p))
            .collect();
        for pack in &copied {
            if bad.contains(pack) {
                catalog::remove_one(to, &layout.pack(pack), catalog::LeaseWait::ONE_KEY)?;
                to_check.fill_refused.push(format!(
                    "pack {pack}: the copy did not check in the {} (removed)",
                    to_check.tier
                ));
                whole = false;
            } else {
                to_check.filled.push(layout.pack(pack));
            }
        }
    }

    // The manifest, decoded against its id before it is copied.
    let manifest_key = layout.generation(&cx.id);
    match catalog::read_manifest(to, layout, &cx.id)? {
        ManifestRead::Present(_) => {}
        _ => {
            catalog::remove_one(to, &manifest_key, catalog::LeaseWait::ONE_KEY)?;
            let bytes = from.get_capped(&manifest_key, MAX_MANIFEST_BYTES as u64)?;
            match bytes.filter(|b| Manifest::decode(b, cx.id).is_ok()) {
                Some(bytes) => {
                    to.put(&manifest_key, &bytes, ValueClass::Record)?;
                    to_check.filled.push(manifest_key);
                }
                None => {
                    to_check.fill_refused.push(format!(
                        "the manifest changed in the {} since it was read",
                        from_check.tier
                    ));
                    whole = false;
                }
            }
        }
    }

    // The heads, last, and only over a whole generation.
    if to_check.announces() {
        return Ok(());
    }
    if !whole {
        to_check.fill_refused.push(format!(
            "no head copied into the {}: it does not hold the whole generation",
            to_check.tier
        ));
        return Ok(());
    }
    catalog::ensure_indexed(
        to,
        layout,
        &manifest.compat_id,
        &manifest.cache_kind,
        &manifest.compat_key,
    )?;
    for (compat, seq) in &cx.from_heads {
        let key = layout.head(compat, *seq);
        let bytes = match from.get_capped(&key, catalog::MAX_HEAD_BYTES) {
            Ok(Some(b)) => b,
            Ok(None) | Err(StoreError::TooLarge { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let Ok(head) = HeadRecord::decode(&bytes) else {
            continue;
        };
        if head.seq != *seq || head.compat_id != *compat || head.generation != cx.id {
            continue;
        }
        let signer = cx.trust.judge(layout.namespace(), &head);
        if !admitted(cx.trust, &signer) {
            to_check.fill_refused.push(format!(
                "head {seq}: not copied, the trust in force does not admit it ({signer})"
            ));
            continue;
        }
        to.put(&key, &bytes, ValueClass::Record)?;
        match to.get_capped(&key, catalog::MAX_HEAD_BYTES)? {
            Some(held) if held == bytes => to_check.filled.push(key),
            _ => to_check.fill_refused.push(format!(
                "head {seq}: the {} holds another record in its slot",
                to_check.tier
            )),
        }
    }
    Ok(())
}
