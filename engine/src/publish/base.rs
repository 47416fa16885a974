//! The base a publish builds on: the newest head it may use, its manifest as the parent, and
//! what this root adds to it.

use std::collections::{HashMap, HashSet};

use crate::catalog::KeyLayout;
use crate::catalog::{self, ManifestRead};
use crate::generation::{
    CompatId, Conflict, FileRecord, GenerationId, HeadRecord, Manifest, RelPath, prune_packs,
};
use crate::scan::ScannedFile;
use crate::store::Store;
use crate::trust::{PublishTrust, Signer};

use super::PublishError;
use super::hashing::Stored;

/// Where a publish builds: the newest head this publisher may build on, its manifest as the
/// parent, and the seq to write first.
pub(super) struct Base {
    /// The head this publish builds on (None: a fresh chain).
    pub(super) head: Option<HeadRecord>,
    /// Who signed it.
    pub(super) signer: Option<Signer>,
    /// Its manifest, less the files whose packs are gone; `None` when it is missing or corrupt.
    pub(super) parent: Option<Manifest>,
    /// The parent lost packs (its files were dropped from `parent`).
    pub(super) parent_damaged: bool,
    /// A head above the base (refused by the trust, corrupt, another place's) that this publish
    /// must write above, so readers find this publisher's head first.
    pub(super) covers_refused_head: bool,
    /// A durable tier does not hold the base's head (added to a store that already held the
    /// chain, or it lost data): a generation is written over the base, so the durable tier
    /// announces one with every pack (`packs::fill_durable_parent`). False without tiers.
    pub(super) unannounced_in_durable: bool,
    pub(super) first_seq: u64,
}

/// The newest seq anyone wrote (this publish writes above it) and the newest head this
/// publisher may build on. A head whose manifest was evicted (or is corrupt) is no parent: this
/// publish starts a fresh chain above it. A parent with evicted packs is used without the files
/// those packs held (they are uploaded again from this root if it has them), so one lost pack
/// cannot make every later generation incomplete.
pub(super) fn find_base(
    store: &dyn Store,
    layout: &KeyLayout,
    compat_id: &CompatId,
    trust: &PublishTrust,
) -> Result<Base, PublishError> {
    let mut walk = catalog::HeadWalk::new(store, layout, compat_id)?;
    let mut occupied = walk.newest_seq();
    // A store of two tiers walks its durable tier's heads; the fast tier may hold newer ones (a
    // durable tier added to a store that already held the chain): this publish writes above them
    // too, so its head never lands in a seq one tier already holds for another generation.
    if let Some((fast, _)) = store.tiers() {
        occupied = occupied.max(catalog::HeadWalk::new(fast, layout, compat_id)?.newest_seq());
    }
    // Seqs pushed towards the ceiling: under `required` a signing publisher clears what it
    // refuses above its base and writes just above the base (`reach`), walking as far as it
    // removes.
    let clears = trust.removes_untrusted() && occupied.is_some_and(super::reach::is_high);
    let limit = if clears {
        super::reach::MAX_REMOVED_PER_PUBLISH
    } else {
        MAX_PASSED_OVER
    };
    let (head, passed) = admitted_base(&mut walk, layout, trust, limit)?;
    let (parent, parent_damaged) = match &head {
        Some(h) => usable_parent(store, layout, &h.generation)?,
        None => (None, false),
    };
    let mut first_seq = first_seq_to_write(occupied, head.as_ref());
    let mut covers_refused_head = occupied != head.as_ref().map(|h| h.seq);
    if clears && !passed.is_empty() {
        let kept = super::reach::remove_heads(store, layout, compat_id, &passed);
        if head.is_none() && passed.len() >= limit {
            // Where the flood ends is unknown: writing in it would start a chain in the upper
            // half. The next publish goes on clearing.
            return Err(PublishError::Flooded {
                removed: passed.len() - kept.len(),
            });
        }
        first_seq = kept
            .iter()
            .copied()
            .chain(head.as_ref().map(|h| h.seq))
            .max()
            .map_or(1, |s| s + 1);
        covers_refused_head = !kept.is_empty();
    }
    let unannounced_in_durable = match (store.tiers(), &head) {
        (Some((_, durable)), Some(h)) => !matches!(
            catalog::read_head_at(durable, layout, compat_id, h.seq)?,
            Some(Ok(d)) if d.generation == h.generation
        ),
        _ => false,
    };
    Ok(Base {
        unannounced_in_durable,
        signer: head
            .as_ref()
            .map(|h| trust.policy().judge(layout.namespace(), h)),
        covers_refused_head,
        first_seq,
        head,
        parent,
        parent_damaged,
    })
}

impl Base {
    /// Whether this publish writes a generation: new files, a damaged parent to repair, an
    /// incomplete parent this complete root completes (the same files, now known to make a
    /// complete cache), or a refused head above a parent to write over.
    pub(super) fn needs_generation(&self, nothing_new: bool, root_complete: bool) -> bool {
        let completes_parent =
            root_complete && self.parent.as_ref().is_some_and(|p| p.incomplete.is_some());
        !nothing_new
            || self.parent_damaged
            || (self.unannounced_in_durable && self.parent.is_some())
            || completes_parent
            || (self.covers_refused_head && self.parent.is_some())
    }
}

/// The hashed files the parent does not have at their path.
pub(super) fn new_files<'l, 's>(
    local: &'l [(&'s ScannedFile, Stored)],
    parent: Option<&Manifest>,
) -> Vec<&'l (&'s ScannedFile, Stored)> {
    let parent_paths: HashSet<&RelPath> = parent
        .iter()
        .flat_map(|m| &m.files)
        .map(|f| &f.path)
        .collect();
    local
        .iter()
        .filter(|(f, _)| !parent_paths.contains(&f.path))
        .collect()
}

/// Paths whose content here differs from the parent's (the parent's version is kept).
pub(super) fn conflicts_with_parent(
    local: &[(&ScannedFile, Stored)],
    parent: Option<&Manifest>,
) -> Vec<Conflict> {
    let parent_paths: HashMap<&RelPath, &FileRecord> = parent
        .iter()
        .flat_map(|m| &m.files)
        .map(|f| (&f.path, f))
        .collect();
    local
        .iter()
        .filter_map(|(f, s)| {
            let p = parent_paths.get(&f.path)?;
            (p.blake3 != s.hash).then(|| Conflict {
                path: f.path.clone(),
                kept: p.blake3,
                dropped: s.hash,
            })
        })
        .collect()
}

/// How many heads a publish passes over (refused by its trust, or faulty) looking for its base
/// before it starts a fresh chain: a store flooded with junk costs a publish a fresh chain, not a
/// long walk. A publisher that clears what it refuses (`reach`) walks up to
/// `super::reach::MAX_REMOVED_PER_PUBLISH`.
pub(super) const MAX_PASSED_OVER: usize = 256;

/// The newest head this publisher may build on: the newest usable head its trust admits, walking
/// down past at most `limit` refused and faulty ones (None: start a fresh chain), with the seqs
/// passed over.
pub(super) fn admitted_base(
    walk: &mut catalog::HeadWalk<'_>,
    layout: &KeyLayout,
    trust: &PublishTrust,
    limit: usize,
) -> Result<(Option<HeadRecord>, Vec<u64>), PublishError> {
    let mut passed = Vec::new();
    while let Some(entry) = walk.next_head()? {
        match entry {
            Ok(h) if trust.admits(layout.namespace(), &h) => {
                if !passed.is_empty() {
                    tracing::warn!(
                        seq = h.seq,
                        passed = passed.len(),
                        "newer heads are not trusted or not usable: building on the newest trusted head"
                    );
                }
                return Ok((Some(h), passed));
            }
            Ok(h) => {
                tracing::debug!(seq = h.seq, generation = %h.generation, "head not admitted by this publisher's trust; passed over");
                passed.push(h.seq);
            }
            Err(f) => {
                tracing::debug!(seq = f.seq, "head passed over: {}", f.fault);
                passed.push(f.seq);
            }
        }
        if passed.len() >= limit {
            tracing::warn!(
                passed = passed.len(),
                "no usable trusted head among the newest; publishing a fresh chain"
            );
            break;
        }
    }
    Ok((None, passed))
}

pub(super) fn first_seq_to_write(occupied: Option<u64>, base: Option<&HeadRecord>) -> u64 {
    match occupied {
        None => 1,
        Some(s) if s < catalog::MAX_SEQ => s + 1,
        Some(_) => base.map_or(1, |b| b.seq + 1),
    }
}

/// The manifest of `id` as a parent, and whether it had to be repaired: `None` if it is missing or
/// does not decode (a corrupt manifest must not block every later publish); files held in packs
/// the store no longer has are dropped from it.
pub(super) fn usable_parent(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
) -> Result<(Option<Manifest>, bool), PublishError> {
    let mut manifest = match catalog::read_manifest(store, layout, id)? {
        ManifestRead::Present(m) => *m,
        ManifestRead::Missing => return Ok((None, false)),
        ManifestRead::Unreadable(source) => {
            tracing::warn!(generation = %id, error = %source, "the head's manifest is corrupt; publishing a fresh chain");
            return Ok((None, false));
        }
    };
    let keys: Vec<String> = manifest.packs.iter().map(|p| layout.pack(&p.id)).collect();
    let mut missing = vec![false; keys.len()];
    for (chunk_no, chunk) in keys.chunks(256).enumerate() {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        for (i, r) in store.exists_batch(&refs).into_iter().enumerate() {
            missing[chunk_no * 256 + i] = !r?;
        }
    }
    if !missing.iter().any(|&m| m) {
        return Ok((Some(manifest), false));
    }
    let before = manifest.files.len();
    manifest
        .files
        .retain(|f| f.chunks.iter().all(|c| !missing[c.pack as usize]));
    prune_packs(&mut manifest);
    tracing::warn!(
        generation = %id,
        packs_missing = missing.iter().filter(|&&m| m).count(),
        files_dropped = before - manifest.files.len(),
        "the head generation lost packs (evicted or collected); building on what is left"
    );
    Ok((Some(manifest), true))
}
