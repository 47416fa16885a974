//! Publishing a cache root as a generation.
//!
//! Order of writes (invariant 1): packs, then the manifest, then the head record. A reader only
//! finds generations through heads, so a crash anywhere leaves nothing visible; the packs and
//! manifest already written are reused by the next publish (puts of existing keys are no-ops) or
//! collected by gc.
//!
//! Steps: scan -> policy.select -> read the newest head and its manifest (the parent) -> hash the
//! selected files not already known -> merge onto the parent -> plan packs for contents the parent
//! lacks -> upload the packs the store lacks -> make sure the compat id is in the compat index
//! (`catalog::ensure_indexed`, so gc and `ls` find it without listing) -> put manifest -> put head
//! seq+1, read it back, and if another publisher won that seq, merge onto its generation and try
//! the next seq (details and the in-flight-put cases: `commit_head`).
//!
//! Reading: small files hashed are kept in memory for their pack, up to one pack's worth
//! (`KeptContents`), so most of a kernel cache is read once; larger files and the rest are read
//! again when their pack is filled, and a change since hashing fails the publish. Packs are
//! filled in place in the store's put buffer (`Store::put_filled`), two at a time.
//!
//! Conflict rule (one path, two contents): the generation already published wins (the head's
//! version when building on it; the winner's when a head race was lost), and the other version is
//! reported in `PublishReport::conflicts`.
//!
//! A head whose manifest is missing or corrupt is not a parent (a fresh chain starts above it);
//! a parent whose packs were evicted or collected is used without the files they held.
//!
//! Deduplication is checked: a pack already in the store is read back and checked before the new
//! generation names it (one holding other bytes is put under a salted key instead), and so are the
//! parent's packs once a generation is to be written (files in one that fails are dropped from
//! the parent and uploaded again); a watcher checks each parent once (`packs`).
//!
//! Signing (`crate::trust`): every head this publisher writes is signed with its key, including the
//! heads it writes after merging a lost head race. A head its trust does not admit (unsigned,
//! untrusted or forged, under `required`) is never a parent and never merged: the publish builds on
//! the newest admitted head below it and writes its signed head above the refused one.

mod base;
mod hashing;
mod head;
mod manifest;
mod packs;
mod reach;
mod report;
mod select;

use std::path::Path;
use std::time::Instant;

use crate::catalog::KeyLayout;
use crate::catalog::{self};
use crate::generation::CompatId;
use crate::policy::{CachePolicy, PolicyError};
use crate::store::Store;

pub use hashing::HashCache;
pub use report::{
    MAX_SKIP_DETAILS, PublishError, PublishOptions, PublishOutcome, PublishReport, RegistryPush,
    SkipDetail,
};

use base::{conflicts_with_parent, find_base, new_files};
use hashing::{RootFiles, RootReader, hash_selected};
use head::commit_head;
use manifest::{
    check_manifest_fits, check_pack_size, new_manifest, plan_new_contents, recorded_settings,
    store_policy_module,
};
use packs::{KeptContents, check_parent_packs, fill_durable_parent, upload_packs};
use select::{scan_root, select};

/// For a one-off publish: the root must exist (`watch` instead waits for a missing root to
/// appear, so `publish` itself treats a missing root as empty).
pub fn check_root_exists(root: &Path) -> Result<(), PublishError> {
    match std::fs::metadata(root) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(PublishError::RootNotDir(root.into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(PublishError::RootMissing(root.into()))
        }
        Err(source) => Err(PublishError::Scan {
            root: root.into(),
            source,
        }),
    }
}

/// Bound on pushing one generation to the durable registry tier (each read and connect has the
/// tier's own `timeout` besides).
const REGISTRY_PUSH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(600);

/// Publishes `root` as a new generation (or reports it unchanged), then, with a durable registry
/// tier, pushes the newest generation the publisher trusts there (a push that fails is in the
/// report; the generation is published in the store all the same, and the next publish pushes
/// it). `hashes` is the watcher's memory of file hashes between publishes; a one-off publish
/// passes `None`, since what it would remember is dropped at exit (remembering 24,000 paths took
/// 6% of hashing).
pub fn publish(
    store: &dyn Store,
    layout: &KeyLayout,
    policy: &dyn CachePolicy,
    root: &Path,
    opts: &PublishOptions,
    hashes: Option<&mut HashCache>,
) -> Result<PublishReport, PublishError> {
    let Some(registry) = &opts.registry else {
        return publish_to_store(store, layout, policy, root, opts, hashes);
    };
    let deadline = Instant::now() + REGISTRY_PUSH_DEADLINE;
    let tee = crate::oci::registry::RegistryTee::new(store, registry, deadline);
    let mut report = publish_to_store(&tee, layout, policy, root, opts, hashes)?;
    if report.outcome != PublishOutcome::Empty {
        let started = Instant::now();
        let pushed = registry.push_newest(
            store,
            layout,
            opts.trust.policy(),
            &report.compat_id,
            deadline,
            &tee.pushed(),
        );
        let (generation, error) = match pushed {
            Ok(g) => (g, None),
            Err(e) => (None, Some(e.to_string())),
        };
        report.registry = Some(RegistryPush {
            registry: registry.describe(),
            generation,
            error,
            duration_ms: started.elapsed().as_millis() as u64,
        });
    }
    Ok(report)
}

/// The phases: select -> base -> hash -> plan and upload -> head.
fn publish_to_store(
    store: &dyn Store,
    layout: &KeyLayout,
    policy: &dyn CachePolicy,
    root: &Path,
    opts: &PublishOptions,
    mut hashes: Option<&mut HashCache>,
) -> Result<PublishReport, PublishError> {
    let started = Instant::now();
    check_can_start(opts)?;
    check_pack_size(store, opts.pack_size)?;
    let kind = policy.info().cache_kind.clone();
    let compat_key = policy
        .compat_key(&opts.facts)
        .map_err(policy_error(policy))?;
    let compat_id = CompatId::new(&kind, &compat_key);
    let mut base = find_base(store, layout, &compat_id, &opts.trust)?;
    let (sticky, settings_note) = recorded_settings(policy, &base, &opts.facts, &compat_key);
    let policy: &dyn CachePolicy = sticky.as_deref().unwrap_or(policy);
    let snap = scan_root(root)?;
    let selection = select(policy, root, &snap)?;
    let mut report = PublishReport::new(kind, root, compat_key, compat_id, &selection);
    report.parent_signer = base.signer.clone();
    report.policy = Some(policy.policy_ref());
    report.settings_kept_from = sticky
        .is_some()
        .then(|| base.head.as_ref().map(|h| h.generation))
        .flatten();
    report.settings_note = settings_note;

    let hashing = Instant::now();
    let kept = KeptContents::new(opts.pack_size);
    let files = RootFiles::open(root)?;
    let reader = RootReader {
        policy,
        files: &files,
        kept: &kept,
        interrupt: &opts.interrupt,
    };
    let parent = base.parent.as_ref();
    let memo = hashes.as_deref_mut();
    let local = hash_selected(&reader, &selection.files, parent, memo, &mut report)?;
    report.hash_ms = hashing.elapsed().as_millis() as u64;
    let mut new_files = new_files(&local, parent);
    report.files_new = new_files.len() as u64;
    if !base.needs_generation(new_files.is_empty(), report.incomplete.is_none()) {
        report.conflicts = conflicts_with_parent(&local, parent);
        report.outcome = match parent {
            Some(m) => PublishOutcome::Unchanged { generation: m.id() },
            None => PublishOutcome::Empty,
        };
        report.duration_ms = started.elapsed().as_millis() as u64;
        return Ok(report);
    }

    // Only now that a generation will be written: its parent's packs are read back and checked
    // before it inherits them, and copied into a durable tier that lacks them; files in one that
    // fails are uploaded again from here.
    let dropped = check_parent_packs(store, layout, &mut base, hashes.as_deref())?;
    if fill_durable_parent(store, layout, &mut base)? || dropped {
        new_files = self::new_files(&local, base.parent.as_ref());
        report.files_new = new_files.len() as u64;
    }
    let parent = base.parent.as_ref();
    let (mut plans, source_of) = plan_new_contents(&new_files, parent, opts.pack_size);
    // The manifest's size is known before any pack is uploaded (a pack that moves to a salted id
    // keeps an id of the same length): one the store would refuse, or installs could not read,
    // stops the publish here, with nothing written.
    let (planned, _) = new_manifest(policy, opts, &base, &new_files, &selection, &plans, &report);
    check_manifest_fits(store, &planned)?;
    drop(planned);
    let uploading = Instant::now();
    // A pack already in the store is checked first; one that held other bytes comes back with the
    // salted id its copy went under, and the manifest names that.
    upload_packs(store, layout, &reader, &mut plans, &source_of, &mut report)?;
    report.upload_ms = uploading.elapsed().as_millis() as u64;
    let (candidate, conflicts) =
        new_manifest(policy, opts, &base, &new_files, &selection, &plans, &report);
    report.conflicts.extend(conflicts);

    // Last point to stop at: from here on the head is written.
    if let Some(signal) = opts.interrupt.signal_name() {
        return Err(PublishError::Interrupted(signal));
    }
    // The policy module goes in the store before the head names it (through the manifest), so
    // gc, inspect and `policy test` can fetch it whatever becomes of the local file.
    store_policy_module(store, layout, policy, &mut report)?;
    // The compat index lets gc and `ls` find this compat id on stores that cannot list keys; it is
    // written before the head, so no head exists that the index does not lead to.
    let (kind, key) = (&candidate.cache_kind, &candidate.compat_key);
    catalog::ensure_indexed(store, layout, &compat_id, kind, key)?;
    let first_seq = base.first_seq;
    let (generation, seq) = commit_head(store, layout, candidate, first_seq, opts, &mut report)?;
    reach::check_reachable(store, layout, &compat_id, seq, &opts.trust)?;
    // Its packs are this publish's own or checked by it (not a race winner's it merged, nor
    // those of a head that carried its files).
    if let Some(memo) = hashes.filter(|_| report.merged.is_empty() && !report.carried) {
        memo.note_checked(generation);
    }
    report.outcome = PublishOutcome::Published { generation, seq };
    report.signed_by = opts.trust.signing_key().map(|k| k.key_id().to_owned());
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

fn policy_error(policy: &dyn CachePolicy) -> impl Fn(PolicyError) -> PublishError + '_ {
    move |source| PublishError::Policy {
        policy: policy.info().name.clone(),
        source,
    }
}

/// Refuses to start when stopped before it began (the CLI's next cache after a signal: not even
/// a scan), or when the trust requires a signature and there is no key to sign with.
fn check_can_start(opts: &PublishOptions) -> Result<(), PublishError> {
    if let Some(signal) = opts.interrupt.signal_name() {
        return Err(PublishError::Interrupted(signal));
    }
    if opts.trust.policy().mode() == crate::config::TrustMode::Required
        && opts.trust.signing_key().is_none()
    {
        return Err(PublishError::NoSigningKey);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
