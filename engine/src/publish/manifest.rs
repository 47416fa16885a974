//! The new generation's manifest: its new packs planned, the parent's files merged, the
//! policy's recorded settings and module, and the store's size limits checked.

use std::collections::{HashMap, HashSet};

use crate::catalog::KeyLayout;
use crate::catalog::{self, now_secs};
use crate::generation::{
    Conflict, ContentHash, FORMAT_VERSION, FileRecord, MAX_MANIFEST_BYTES, Manifest, PackPlan,
    merge_files, place_files, plan_packs, prune_packs,
};
use crate::policy::CachePolicy;
use crate::scan::ScannedFile;
use crate::store::Store;

use super::base::Base;
use super::hashing::Stored;
use super::select::Chosen;
use super::{PublishError, PublishOptions, PublishReport};

/// Where each new content's bytes come from.
pub(super) type Sources<'s> = HashMap<ContentHash, (&'s ScannedFile, Stored)>;

/// The packs for contents the parent does not already store (those are referenced, not uploaded
/// again), and where each content is read from.
pub(super) fn plan_new_contents<'s>(
    new_files: &[&(&'s ScannedFile, Stored)],
    parent: Option<&Manifest>,
    pack_size: u64,
) -> (Vec<PackPlan>, Sources<'s>) {
    let parent_contents: HashSet<ContentHash> = parent
        .iter()
        .flat_map(|m| m.files.iter().map(|f| f.blake3))
        .collect();
    let mut order: Vec<(ContentHash, u64)> = Vec::new();
    let mut source_of: Sources = HashMap::new();
    for (f, s) in new_files {
        if !parent_contents.contains(&s.hash) && !source_of.contains_key(&s.hash) {
            source_of.insert(s.hash, (*f, *s));
            order.push((s.hash, s.size));
        }
    }
    (plan_packs(&order, pack_size), source_of)
}

/// The new generation's manifest: the new files, located in parent packs or in the packs just
/// uploaded, merged onto the parent (whose version wins a conflicting path), and the paths whose
/// content here lost to the parent's.
pub(super) fn new_manifest(
    policy: &dyn CachePolicy,
    opts: &PublishOptions,
    base: &Base,
    new_files: &[&(&ScannedFile, Stored)],
    selection: &Chosen,
    plans: &[PackPlan],
    report: &PublishReport,
) -> (Manifest, Vec<Conflict>) {
    let parent = base.parent.as_ref();
    let unplaced: Vec<FileRecord> = new_files
        .iter()
        .map(|(f, s)| FileRecord {
            path: f.path.clone(),
            size: s.size,
            mode: f.mode,
            mtime_s: f.mtime_s,
            mtime_ns: f.mtime_ns,
            blake3: s.hash,
            chunks: vec![],
            marker: selection.markers.contains(&f.path),
            canonical: s.canonical,
        })
        .collect();
    let (ours_files, ours_packs) = place_files(parent, unplaced, plans);
    let (files, packs, conflicts) = match parent {
        Some(p) => merge_files(&p.files, &p.packs, &ours_files, &ours_packs),
        None => merge_files(&[], &[], &ours_files, &ours_packs),
    };
    let mut manifest = Manifest {
        format: FORMAT_VERSION,
        cache_kind: report.cache_kind.clone(),
        compat_key: report.compat_key.clone(),
        compat_id: report.compat_id,
        facts: opts.facts.as_map().clone(),
        policy: policy.policy_ref(),
        parent: parent.and(base.head.as_ref().map(|h| h.generation)),
        merged: vec![],
        producer: opts.producer.clone(),
        created_at: now_secs(),
        packs,
        files,
        incomplete: report.incomplete.clone(),
    };
    prune_packs(&mut manifest);
    (manifest, conflicts)
}

/// Sticky settings: `policy` configured with the settings the key's newest generation (the base
/// this publish builds on) recorded, when the operator gave none for the cache and they differ
/// (`CachePolicy::with_recorded_settings`). Kept only if the key stays the same; otherwise, or
/// when the module refuses them, the configured settings apply and the note says why.
pub(super) fn recorded_settings(
    policy: &dyn CachePolicy,
    base: &Base,
    facts: &crate::facts::Facts,
    compat_key: &str,
) -> (Option<Box<dyn CachePolicy>>, Option<String>) {
    let Some(parent) = &base.parent else {
        return (None, None);
    };
    let recorded = &parent.policy;
    let said = crate::policy::host::describe(&recorded.settings);
    match policy.with_recorded_settings(recorded) {
        None => (None, None),
        Some(Ok(p)) => match p.compat_key(facts) {
            Ok(k) if k == compat_key => (Some(p), None),
            _ => (
                None,
                Some(format!(
                    "the settings the key's newest generation recorded ({said}) give another key; \
                     publishing with the configured settings"
                )),
            ),
        },
        Some(Err(e)) => {
            tracing::warn!("settings the key's newest generation recorded are refused: {e}");
            (
                None,
                Some(format!(
                    "this module refuses the settings the key's newest generation recorded \
                     ({said}): {e}; publishing with the configured settings"
                )),
            )
        }
    }
}

/// Stores the module of `policy` by its digest (`catalog::modules`), unless it is one of the
/// built-in modules every jitship carries (gc finds those in itself, and decides keys of an
/// older built-in with today's: `gc`). A key someone else holds with other bytes is reported,
/// never a reason to fail: gc then keeps the key whole until it has the module.
pub(super) fn store_policy_module(
    store: &dyn Store,
    layout: &KeyLayout,
    policy: &dyn CachePolicy,
    report: &mut PublishReport,
) -> Result<(), PublishError> {
    let Some(bytes) = policy.module() else {
        return Ok(());
    };
    if crate::policy::builtin::is_builtin(&bytes) {
        return Ok(());
    }
    if let catalog::modules::ModulePut::Refused(why) =
        catalog::modules::put_module(store, layout, &bytes)?
    {
        tracing::warn!("policy module not stored: {why}");
        report.module_not_stored = Some(why);
    }
    Ok(())
}

/// The largest manifest a publish may write to `store`: what the store takes as one value, and
/// no more than every reader accepts (`MAX_MANIFEST_BYTES`: install, verify and gc read a
/// manifest under that cap), so a generation that fits is one installs can read.
pub(super) fn manifest_limit(store: &dyn Store) -> u64 {
    store.max_value_size().min(MAX_MANIFEST_BYTES as u64)
}

/// Refuses a manifest over `manifest_limit`, with its numbers and what to do, before anything of
/// its generation is written (the manifest is one value: a bigger one fails its put, or worse
/// passes it on a store with a higher limit than readers accept).
pub(super) fn check_manifest_fits(
    store: &dyn Store,
    manifest: &Manifest,
) -> Result<(), PublishError> {
    let size = manifest.encoded_len();
    let limit = manifest_limit(store);
    if size <= limit {
        return Ok(());
    }
    let files = manifest.files.len() as u64;
    let readers_cap = limit == MAX_MANIFEST_BYTES as u64;
    let split = "publish fewer files per generation: split the cache root into caches of fewer \
                 files (each cache kind and compat key is a generation of its own)";
    Err(PublishError::ManifestTooLarge {
        files,
        size,
        limit,
        limit_of: if readers_cap {
            "every jitship reader accepts a manifest under".into()
        } else {
            format!("on one value in {}", store.describe())
        },
        files_that_fit: limit / (size / files.max(1)).max(1),
        what_to_do: if readers_cap {
            format!("{split}; this cap is fixed")
        } else {
            format!(
                "{split}, or raise the store's value limit (on Mooncake \
                 store.mooncake.staging_buffer_size, on every publisher and installer alike)"
            )
        },
    })
}

/// Refuses a pack size over the largest value the store takes: every pack of this size would
/// fail its put, after the files were hashed and some packs uploaded.
pub(super) fn check_pack_size(store: &dyn Store, pack_size: u64) -> Result<(), PublishError> {
    let limit = store.max_value_size();
    if pack_size <= limit {
        return Ok(());
    }
    Err(PublishError::PackSizeOverLimit {
        pack_size,
        limit,
        store: store.describe(),
    })
}
