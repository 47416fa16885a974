//! Removing, in an order a reader never half-sees: floors, journal, heads, manifests, packs.

use std::collections::{HashMap, HashSet};

use crate::catalog::KeyLayout;
use crate::catalog::{self, ManifestRead};
use crate::generation::ContentHash;
use crate::store::Store;

use super::plan::module_of;
use super::report::GcReport;
use super::retention::counts_signer;
use super::{GcError, GcOptions, Plan};

/// Removes in an order a reader never half-sees: 1. floors, 2. journal, 3. heads, manifests,
/// packs (sparing those of generations published while gc ran).
pub(super) fn remove(
    store: &dyn Store,
    layout: &KeyLayout,
    opts: &GcOptions,
    plan: &Plan,
    mut packs: Vec<(ContentHash, u64)>,
    deferred_packs: Vec<ContentHash>,
    report: &mut GcReport,
) -> Result<(), GcError> {
    for (compat, floor, keep) in &plan.floors {
        catalog::write_floor(store, layout, compat, *floor, keep.clone())?;
    }
    let manifest_keys: Vec<String> = report
        .manifests
        .iter()
        .map(|id| layout.generation(id))
        .chain(plan.resumed.iter().filter(|k| k.contains("/gen/")).cloned())
        .collect();
    let contribution_keys: Vec<String> = plan
        .contributions
        .iter()
        .chain(plan.resumed.iter().filter(|k| k.contains("/contrib/")))
        .cloned()
        .collect();
    let module_keys: Vec<String> = plan
        .modules
        .iter()
        .map(|d| layout.module(d))
        .chain(
            plan.resumed
                .iter()
                .filter(|k| k.contains("/module/"))
                .cloned(),
        )
        .collect();
    let mut journal_keys = report.heads.clone();
    journal_keys.extend(contribution_keys.iter().cloned());
    journal_keys.extend(manifest_keys.iter().cloned());
    journal_keys.extend(module_keys.iter().cloned());
    let journal_packs = packs.iter().map(|p| p.0).chain(deferred_packs).collect();
    let journal = catalog::write_gc_journal(store, layout, journal_keys, journal_packs)?;
    report.journal = Some(journal.seq);
    let heads = report.heads.clone();
    remove_all(store, &heads, opts, &mut report.errors);
    // A contribution goes before the manifest it names: a reader never finds one naming nothing.
    remove_all(store, &contribution_keys, opts, &mut report.errors);
    remove_all(store, &manifest_keys, opts, &mut report.errors);
    let (spared, spared_modules) = spared_packs(store, layout, opts, plan, report)?;
    if !report.unreadable.is_empty() {
        packs.clear();
    }
    remove_packs(store, layout, opts, packs, &spared, report);
    // Modules last: after every manifest that named them, sparing those of generations published
    // while gc ran (and all of them if one of those cannot be read).
    if report.unreadable.is_empty() {
        let keys: Vec<String> = module_keys
            .into_iter()
            .filter(|k| {
                k.strip_prefix(&layout.modules_prefix())
                    .and_then(|d| d.parse::<ContentHash>().ok())
                    .is_some_and(|d| !spared_modules.contains(&d))
            })
            .collect();
        for key in remove_all(store, &keys, opts, &mut report.errors) {
            if let Some(d) = key
                .strip_prefix(&layout.modules_prefix())
                .and_then(|d| d.parse().ok())
            {
                report.modules.push(d);
            }
        }
    }
    if report.errors.is_empty() && report.unreadable.is_empty() {
        catalog::mark_gc_done(store, layout, journal.seq)?;
    }
    Ok(())
}

/// Packs no run may remove now: those retained generations reference, and those of every
/// generation published (and counting) while gc ran. A generation published meanwhile that this
/// jitship cannot read (a newer jitship's) may reference any pack: it goes to `unreadable`, and
/// no pack is removed.
pub(super) fn spared_packs(
    store: &dyn Store,
    layout: &KeyLayout,
    opts: &GcOptions,
    plan: &Plan,
    report: &mut GcReport,
) -> Result<(HashSet<ContentHash>, HashSet<ContentHash>), GcError> {
    let mut spared = plan.retained.clone();
    let mut spared_modules = plan.retained_modules.clone();
    for compat in catalog::compat_ids(store, layout)? {
        let Some(head) = catalog::newest_head(store, layout, &compat)? else {
            continue;
        };
        if plan.known.contains(&head.generation)
            || !counts_signer(opts, &opts.trust.judge(layout.namespace(), &head))
        {
            continue;
        }
        match catalog::read_manifest(store, layout, &head.generation)? {
            ManifestRead::Present(m) => {
                spared.extend(m.packs.iter().map(|p| p.id));
                spared_modules.extend(module_of(&m.policy));
            }
            ManifestRead::Missing => {}
            ManifestRead::Unreadable(source) => {
                report.unreadable.push(format!(
                    "compat id {compat} generation {} (published during this gc): {source}",
                    head.generation
                ));
            }
        }
    }
    Ok((spared, spared_modules))
}

pub(super) fn remove_packs(
    store: &dyn Store,
    layout: &KeyLayout,
    opts: &GcOptions,
    packs: Vec<(ContentHash, u64)>,
    spared: &HashSet<ContentHash>,
    report: &mut GcReport,
) {
    let mut pack_keys = Vec::new();
    let mut size_of: HashMap<String, (ContentHash, u64)> = HashMap::new();
    for (id, mut size) in packs {
        if spared.contains(&id) {
            report.packs_shared += 1;
            continue;
        }
        let key = layout.pack(&id);
        // Orphans found by listing and packs of a resumed journal come without a size.
        if size == 0 {
            size = store.size(&key).ok().flatten().unwrap_or(0);
        }
        size_of.insert(key.clone(), (id, size));
        pack_keys.push(key);
    }
    // Replicas first (publish's `[publish] pack_replicas`, whatever this run's setting: every
    // possible one, found with one batch of exists), so a failed run leaves the primary, which
    // its journal names for the next run to retry, rather than replicas nothing can find.
    let replicas = replica_keys(store, layout, size_of.values().map(|(id, _)| *id));
    remove_all(store, &replicas, opts, &mut report.errors);
    for key in remove_all(store, &pack_keys, opts, &mut report.errors) {
        if let Some(&(id, size)) = size_of.get(&key) {
            report.packs.push(id);
            report.pack_bytes += size;
            if size == 0 {
                report.packs_unknown_size += 1;
            }
        }
    }
}

/// The replica keys of `packs` the store holds.
pub(super) fn replica_keys(
    store: &dyn Store,
    layout: &KeyLayout,
    packs: impl Iterator<Item = ContentHash>,
) -> Vec<String> {
    let keys: Vec<String> = packs
        .flat_map(|id| (1..KeyLayout::MAX_PACK_REPLICAS).map(move |k| layout.pack_copy(&id, k)))
        .collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    // One whose existence cannot be told is tried: removing what is absent is harmless.
    let present = store.exists_batch(&refs);
    keys.iter()
        .zip(present)
        .filter(|(_, p)| !matches!(p, Ok(false)))
        .map(|(k, _)| k.clone())
        .collect()
}

/// Removes `keys`, waiting out readers' leases (`opts.lease_wait` apart, at most
/// `opts.lease_rounds` times); other failures are recorded and gc goes on. Returns the keys that
/// were there and are gone.
pub(super) fn remove_all(
    store: &dyn Store,
    keys: &[String],
    opts: &GcOptions,
    errors: &mut Vec<String>,
) -> Vec<String> {
    let wait = catalog::LeaseWait {
        interval: opts.lease_wait,
        rounds: opts.lease_rounds,
    };
    let removal = catalog::remove_waiting_out_leases(store, keys, wait);
    errors.extend(removal.failed.iter().map(|(key, e)| format!("{key}: {e}")));
    removal.removed
}
