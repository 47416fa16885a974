//! Building the plan: what besides retention's drops this run removes (merged losers, spent
//! contributions, orphans), and which packs and modules may go.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use crate::catalog::KeyLayout;
use crate::catalog::{self, ManifestRead};
use crate::generation::{ContentHash, GenerationId, PolicyRef};
use crate::inspect::{self, ManifestState};
use crate::store::{Store, StoreError};

use super::report::GcReport;
use super::retention::counts;
use super::{GcError, GcOptions, Plan};

/// Faulty heads are reported and left in place; a manifest that counts but cannot be decoded
/// makes gc fail closed (`unreadable`). Only a generation that counts can hold up pack removal:
/// an untrusted store writer's garbage manifest must not stop gc.
pub(super) fn note_faulty_and_unreadable(
    survey: &inspect::Survey,
    opts: &GcOptions,
    report: &mut GcReport,
) {
    for c in &survey.compats {
        for f in &c.faulty_heads {
            report.faulty_heads.push(format!(
                "compat id {} seq {}: {} (left in place; readers pass it over)",
                c.compat_id, f.seq, f.fault
            ));
        }
        let unnamed = c.faulty_count.saturating_sub(c.faulty_heads.len() as u64);
        if unnamed > 0 {
            report.faulty_heads.push(format!(
                "compat id {}: {unnamed} more heads that are no usable head, below those (left in place)",
                c.compat_id
            ));
        }
    }
    for (c, g) in survey.generations().filter(|(_, g)| counts(opts, g)) {
        if let ManifestState::Corrupt { error } = &g.state {
            report.unreadable.push(format!(
                "compat id {} generation {}: {error}",
                c.compat_id, g.id
            ));
        }
    }
}

/// Manifests that lost a head race and were merged into a winner: never headed, so garbage.
pub(super) fn add_merged_losers(
    store: &dyn Store,
    layout: &KeyLayout,
    survey: &inspect::Survey,
    plan: &mut Plan,
) -> Result<(), GcError> {
    let losers: BTreeSet<GenerationId> = survey
        .generations()
        .filter_map(|(_, g)| g.summary())
        .flat_map(|s| s.merged.iter().copied())
        .filter(|id| !plan.known.contains(id))
        .collect();
    for id in losers {
        if let Some(m) = fetch_if_decodable(store, layout, &id)? {
            drop_manifest(plan, id, &m);
        }
    }
    Ok(())
}

/// Contributions (`catalog::contributions`) that are spent: those at a seq whose next head was
/// written more than `grace` ago. Their writers are long done: the next head merged them, or
/// their writer contributed again above. The record goes, and the manifest it names unless a head
/// names it, with that manifest's `merged` (its writer's earlier lost attempts) and their packs
/// (removed only if no retained generation references them). Within `grace` a contribution may
/// belong to a publish still running, whose packs no head names yet. Contributions at the newest
/// seq stay: the next publish's writer may still read them. Anyone can write these records: at
/// most `CONTRIBUTION_SLOTS` are read per seq, each under the head cap, and a manifest is removed
/// only if no head names it.
pub(super) fn add_spent_contributions(
    store: &dyn Store,
    layout: &KeyLayout,
    survey: &inspect::Survey,
    opts: &GcOptions,
    plan: &mut Plan,
) -> Result<(), GcError> {
    let grace = opts.grace.as_secs();
    for compat in &survey.compats {
        let written_at: HashMap<u64, u64> = compat
            .generations
            .iter()
            .flat_map(|g| g.seqs.iter().map(move |&seq| (seq, g.head_written_at)))
            .collect();
        let spent = written_at.keys().copied().filter(|seq| {
            written_at
                .get(&(seq + 1))
                .is_some_and(|&t| opts.now.saturating_sub(t) >= grace)
        });
        let mut named = BTreeSet::new();
        for seq in spent.collect::<BTreeSet<_>>() {
            for (slot, read) in
                catalog::contributions::read_contributions(store, layout, &compat.compat_id, seq)?
            {
                plan.contributions
                    .push(layout.contribution(&compat.compat_id, seq, slot));
                if let Ok(record) = read {
                    named.insert(record.generation);
                }
            }
        }
        let mut earlier = BTreeSet::new();
        for id in &named {
            if plan.known.contains(id) {
                continue;
            }
            if let Some(m) = fetch_if_decodable(store, layout, id)? {
                earlier.extend(m.merged.iter().copied());
                drop_manifest(plan, *id, &m);
            }
        }
        for id in earlier.difference(&named) {
            if plan.known.contains(id) || plan.manifests.contains(id) {
                continue;
            }
            if let Some(m) = fetch_if_decodable(store, layout, id)? {
                drop_manifest(plan, *id, &m);
            }
        }
    }
    Ok(())
}

pub(super) fn drop_manifest(plan: &mut Plan, id: GenerationId, m: &crate::generation::Manifest) {
    plan.manifests.insert(id);
    for p in &m.packs {
        plan.dropped_packs.insert(p.id, p.size);
    }
    plan.dropped_modules.extend(module_of(&m.policy));
}

/// The stored module a manifest names (`catalog::modules`): its policy's digest, unless that is
/// `native` or another word no module is stored under.
pub(super) fn module_of(policy: &PolicyRef) -> Option<ContentHash> {
    policy.digest.parse().ok()
}

/// Orphans, where the store can list and date keys: manifests and packs nothing references,
/// written more than `grace` ago (crashed publishes). Orphan packs are looked for only when every
/// generation could be read (see `unreadable`).
pub(super) fn add_orphans(
    store: &dyn Store,
    layout: &KeyLayout,
    opts: &GcOptions,
    plan: &mut Plan,
    report: &GcReport,
) -> Result<(), GcError> {
    let grace_cutoff = SystemTime::UNIX_EPOCH + Duration::from_secs(opts.now)
        - opts.grace.min(Duration::from_secs(opts.now));
    let dates = store.capabilities().write_times;
    let old_enough = |key: &str| -> Result<bool, StoreError> {
        Ok(dates && store.modified(key)?.is_some_and(|t| t <= grace_cutoff))
    };
    let manifests = layout.generations_prefix();
    for key in list_or_none(store, &manifests)?.unwrap_or_default() {
        let Some(id) = key.strip_prefix(&manifests).and_then(|s| s.parse().ok()) else {
            continue;
        };
        if !plan.known.contains(&id) && !plan.manifests.contains(&id) && old_enough(&key)? {
            plan.manifests.insert(id);
        }
    }
    if !report.unreadable.is_empty() {
        return Ok(());
    }
    let modules = layout.modules_prefix();
    for key in list_or_none(store, &modules)?.unwrap_or_default() {
        let Some(digest) = key.strip_prefix(&modules).and_then(|s| s.parse().ok()) else {
            continue;
        };
        if !plan.retained_modules.contains(&digest) && old_enough(&key)? {
            plan.dropped_modules.insert(digest);
        }
    }
    let packs = layout.packs_prefix();
    for key in list_or_none(store, &packs)?.unwrap_or_default() {
        let Some(id) = key.strip_prefix(&packs).and_then(|s| s.parse().ok()) else {
            continue;
        };
        if !plan.retained.contains(&id)
            && !plan.dropped_packs.contains_key(&id)
            && old_enough(&key)?
        {
            plan.dropped_packs.insert(id, 0);
        }
    }
    Ok(())
}

/// The packs to remove, sorted: those dropped that no retained generation references (the
/// others are counted as shared).
pub(super) fn settle_packs(plan: &mut Plan, report: &mut GcReport) -> Vec<(ContentHash, u64)> {
    let mut packs = Vec::new();
    for (id, size) in std::mem::take(&mut plan.dropped_packs) {
        if plan.retained.contains(&id) {
            report.packs_shared += 1;
        } else {
            packs.push((id, size));
        }
    }
    packs.sort();
    packs
}

/// The stored modules to remove: those a removed (or orphan) generation named that no retained
/// one names. None while a generation gc cannot read counts (it may name any module).
pub(super) fn settle_modules(plan: &mut Plan, report: &GcReport) -> Vec<ContentHash> {
    let dropped = std::mem::take(&mut plan.dropped_modules);
    if !report.unreadable.is_empty() {
        return vec![];
    }
    dropped
        .into_iter()
        .filter(|d| !plan.retained_modules.contains(d))
        .collect()
}

pub(super) fn fetch_if_decodable(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
) -> Result<Option<crate::generation::Manifest>, GcError> {
    match catalog::read_manifest(store, layout, id)? {
        ManifestRead::Present(m) => Ok(Some(*m)),
        ManifestRead::Missing | ManifestRead::Unreadable(_) => Ok(None),
    }
}

pub(super) fn list_or_none(
    store: &dyn Store,
    prefix: &str,
) -> Result<Option<Vec<String>>, StoreError> {
    if store.capabilities().listing {
        store.list(prefix).map(Some)
    } else {
        Ok(None)
    }
}
