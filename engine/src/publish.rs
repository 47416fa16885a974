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
//! Signing (`crate::trust`): every head this publisher writes is signed with its key, including the
//! heads it writes after merging a lost head race. A head its trust does not admit (unsigned,
//! untrusted or forged, under `required`) is never a parent and never merged: the publish builds on
//! the newest admitted head below it and writes its signed head above the refused one.

mod hashing;
mod head;
mod packs;
mod report;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Instant;

use crate::catalog::KeyLayout;
use crate::catalog::{self, ManifestRead, now_secs};
use crate::generation::{
    CompatId, Conflict, ContentHash, FORMAT_VERSION, FileRecord, GenerationId, HeadRecord,
    Manifest, RelPath, merge_files, place_files, plan_packs, prune_packs,
};
use crate::policy::{CachePolicy, Decision, ReasonCategory, Verdict};
use crate::scan::{self, ScannedFile};
use crate::store::Store;
use crate::trust::PublishTrust;

pub use hashing::HashCache;
pub use report::{
    MAX_SKIP_DETAILS, PublishError, PublishOptions, PublishOutcome, PublishReport, RegistryPush,
    SkipDetail,
};

use hashing::{RootFiles, Stored, hash_selected};
use head::commit_head;
use packs::{KeptContents, upload_packs};

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
            &opts.trust.policy,
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

fn publish_to_store(
    store: &dyn Store,
    layout: &KeyLayout,
    policy: &dyn CachePolicy,
    root: &Path,
    opts: &PublishOptions,
    hashes: Option<&mut HashCache>,
) -> Result<PublishReport, PublishError> {
    let started = Instant::now();
    // Stopped before it began (the CLI's next cache after a signal): not even a scan.
    if let Some(signal) = opts.interrupt.signal_name() {
        return Err(PublishError::Interrupted(signal));
    }
    if opts.trust.policy.mode() == crate::config::TrustMode::Required
        && opts.trust.signing_key.is_none()
    {
        return Err(PublishError::NoSigningKey);
    }
    let kind = policy.info().cache_kind.clone();
    let policy_err = |source| PublishError::Policy {
        policy: policy.info().name.clone(),
        source,
    };
    let compat_key = policy.compat_key(&opts.facts).map_err(policy_err)?;
    let compat_id = CompatId::new(&kind, &compat_key);

    // A file where the root should be is never a cache (a missing root is: not written yet).
    if std::fs::metadata(root).is_ok_and(|m| !m.is_dir()) {
        return Err(PublishError::RootNotDir(root.into()));
    }
    let snap = scan::snapshot(root).map_err(|source| PublishError::Scan {
        root: root.into(),
        source,
    })?;
    let entries: Vec<_> = snap.files.iter().map(ScannedFile::entry).collect();
    let selection = policy.select(root, &entries).map_err(policy_err)?;
    let incomplete = selection.incomplete();
    let decisions = selection.decisions;
    if decisions.len() != entries.len() {
        return Err(PublishError::PolicyContract(
            policy.info().name.clone(),
            decisions.len(),
            entries.len(),
        ));
    }
    let mut skipped: BTreeMap<ReasonCategory, u64> = BTreeMap::new();
    let mut skip_details = Vec::new();
    let mut note_skip = |path: &str, category: ReasonCategory, detail: &str| {
        *skipped.entry(category).or_default() += 1;
        if skip_details.len() < MAX_SKIP_DETAILS {
            skip_details.push(SkipDetail {
                path: path.to_owned(),
                category,
                detail: detail.to_owned(),
            });
        }
    };
    // What the scan never offers (links, special files, names that are not UTF-8) is left out by
    // jitship itself.
    for (path, reason) in &snap.unpublishable {
        note_skip(path, ReasonCategory::Excluded, reason);
    }
    let selected: Vec<(&ScannedFile, &Decision)> = snap
        .files
        .iter()
        .zip(&decisions)
        .filter_map(|(f, d)| match d.verdict {
            Verdict::Publish => Some((f, d)),
            Verdict::Skip => {
                note_skip(f.path.as_str(), d.category, &d.detail);
                None
            }
        })
        .collect();
    let markers: HashSet<&RelPath> = selected
        .iter()
        .filter(|(_, d)| d.marker)
        .map(|(f, _)| &f.path)
        .collect();
    // Files that name the root are stored in the policy's root-independent form.
    let selected: Vec<(&ScannedFile, bool)> = selected
        .into_iter()
        .map(|(f, d)| (f, d.embeds_root))
        .collect();

    let mut report = PublishReport {
        cache_kind: kind.clone(),
        root: root.into(),
        compat_key: compat_key.clone(),
        compat_id,
        outcome: PublishOutcome::Empty,
        files_selected: selected.len() as u64,
        skipped,
        skip_details,
        incomplete,
        files_new: 0,
        files_hashed: 0,
        bytes_uploaded: 0,
        bytes_deduplicated: 0,
        packs_uploaded: 0,
        packs_reused: 0,
        conflicts: vec![],
        merged: vec![],
        signed_by: None,
        parent_signer: None,
        hash_ms: 0,
        upload_ms: 0,
        duration_ms: 0,
        registry: None,
    };

    // The newest seq anyone wrote (this publish writes above it) and the newest head this
    // publisher may build on. Any head above that base (refused by the trust, corrupt, another
    // place's) is covered: the publish writes a head even if nothing is new, so readers find
    // this publisher's head first.
    let mut walk = catalog::HeadWalk::new(store, layout, &compat_id)?;
    let occupied = walk.newest_seq();
    let head = admitted_base(&mut walk, layout, &opts.trust)?;
    let covers_refused_head = occupied != head.as_ref().map(|h| h.seq);
    let first_seq = first_seq_to_write(occupied, head.as_ref());
    report.parent_signer = head
        .as_ref()
        .map(|h| opts.trust.policy.judge(layout.namespace(), h));
    // A head whose manifest was evicted (or is corrupt) is no parent: this publish starts a fresh
    // chain above it. A parent with evicted packs is used without the files those packs held
    // (they are uploaded again from this root if it has them), so one lost pack cannot make every
    // later generation incomplete.
    let parent_id = head.as_ref().map(|h| h.generation);
    let (parent, parent_damaged) = match &head {
        Some(h) => usable_parent(store, layout, &h.generation)?,
        None => (None, false),
    };

    let hashing = Instant::now();
    let kept = KeptContents::new(opts.pack_size);
    let files = RootFiles::open(root)?;
    let local = hash_selected(
        policy,
        &files,
        &selected,
        parent.as_ref(),
        hashes,
        &kept,
        &opts.interrupt,
        &mut report,
    )?;
    report.hash_ms = hashing.elapsed().as_millis() as u64;
    let parent_paths: HashMap<&RelPath, &FileRecord> = parent
        .iter()
        .flat_map(|m| &m.files)
        .map(|f| (&f.path, f))
        .collect();
    let new_files: Vec<&(&ScannedFile, Stored)> = local
        .iter()
        .filter(|(f, _)| !parent_paths.contains_key(&f.path))
        .collect();
    report.files_new = new_files.len() as u64;
    // A parent recorded as incomplete whose files this complete root holds no more of still gets
    // a new generation: the same files, now known to make a complete cache.
    let completes_parent =
        report.incomplete.is_none() && parent.as_ref().is_some_and(|p| p.incomplete.is_some());
    if new_files.is_empty()
        && !parent_damaged
        && !completes_parent
        && (!covers_refused_head || parent.is_none())
    {
        report.conflicts = local
            .iter()
            .filter_map(|(f, s)| {
                let p = parent_paths.get(&f.path)?;
                (p.blake3 != s.hash).then(|| Conflict {
                    path: f.path.clone(),
                    kept: p.blake3,
                    dropped: s.hash,
                })
            })
            .collect();
        report.outcome = match &parent {
            Some(m) => PublishOutcome::Unchanged { generation: m.id() },
            None => PublishOutcome::Empty,
        };
        report.duration_ms = started.elapsed().as_millis() as u64;
        return Ok(report);
    }

    // Contents the parent already stores are referenced, not uploaded again.
    let parent_contents: HashSet<ContentHash> = parent
        .iter()
        .flat_map(|m| m.files.iter().map(|f| f.blake3))
        .collect();
    let mut order: Vec<(ContentHash, u64)> = Vec::new();
    let mut source_of: HashMap<ContentHash, (&ScannedFile, Stored)> = HashMap::new();
    for (f, s) in &new_files {
        if !parent_contents.contains(&s.hash) && !source_of.contains_key(&s.hash) {
            source_of.insert(s.hash, (*f, *s));
            order.push((s.hash, s.size));
        }
    }
    let plans = plan_packs(&order, opts.pack_size);
    let uploading = Instant::now();
    upload_packs(
        store,
        layout,
        policy,
        &files,
        &plans,
        &source_of,
        &kept,
        &opts.interrupt,
        &mut report,
    )?;
    report.upload_ms = uploading.elapsed().as_millis() as u64;

    // Our side: the new files, located in parent packs or in the packs just uploaded.
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
            marker: markers.contains(&f.path),
            canonical: s.canonical,
        })
        .collect();
    let (ours_files, ours_packs) = place_files(parent.as_ref(), unplaced, &plans);

    let mut candidate = Manifest {
        format: FORMAT_VERSION,
        cache_kind: kind,
        compat_key,
        compat_id,
        facts: opts.facts.as_map().clone(),
        policy: policy.policy_ref(),
        parent: parent_id.filter(|_| parent.is_some()),
        merged: vec![],
        producer: opts.producer.clone(),
        created_at: now_secs(),
        packs: vec![],
        files: vec![],
        incomplete: report.incomplete.clone(),
    };
    let (files, packs, conflicts) = match &parent {
        Some(p) => merge_files(&p.files, &p.packs, &ours_files, &ours_packs),
        None => merge_files(&[], &[], &ours_files, &ours_packs),
    };
    candidate.files = files;
    candidate.packs = packs;
    report.conflicts.extend(conflicts);
    prune_packs(&mut candidate);

    // Last point to stop at: from here on the head is written.
    if let Some(signal) = opts.interrupt.signal_name() {
        return Err(PublishError::Interrupted(signal));
    }
    // The compat index lets gc and `ls` find this compat id on stores that cannot list keys; it is
    // written before the head, so no head exists that the index does not lead to.
    catalog::ensure_indexed(
        store,
        layout,
        &compat_id,
        &candidate.cache_kind,
        &candidate.compat_key,
    )?;
    let (generation, seq) = commit_head(store, layout, candidate, first_seq, opts, &mut report)?;
    report.outcome = PublishOutcome::Published { generation, seq };
    report.signed_by = opts
        .trust
        .signing_key
        .as_ref()
        .map(|k| k.key_id().to_owned());
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// How many heads a publish passes over (refused by its trust, or faulty) looking for its base
/// before it starts a fresh chain: a store flooded with junk costs a publish a fresh chain, not a
/// long walk.
const MAX_PASSED_OVER: usize = 256;

/// The newest head this publisher may build on: the newest usable head its trust admits, walking
/// down past refused and faulty ones (None: start a fresh chain).
fn admitted_base(
    walk: &mut catalog::HeadWalk<'_>,
    layout: &KeyLayout,
    trust: &PublishTrust,
) -> Result<Option<HeadRecord>, PublishError> {
    let mut passed = 0;
    while let Some(entry) = walk.next_head()? {
        match entry {
            Ok(h) if trust.admits(layout.namespace(), &h) => {
                if passed > 0 {
                    tracing::warn!(
                        seq = h.seq,
                        passed,
                        "newer heads are not trusted or not usable: building on the newest trusted head and writing above them"
                    );
                }
                return Ok(Some(h));
            }
            Ok(h) => {
                tracing::warn!(seq = h.seq, generation = %h.generation, "head not admitted by this publisher's trust; passed over");
            }
            Err(f) => tracing::warn!(seq = f.seq, "head passed over: {}", f.fault),
        }
        passed += 1;
        if passed >= MAX_PASSED_OVER {
            tracing::warn!(
                passed,
                "no usable trusted head among the newest; publishing a fresh chain"
            );
            break;
        }
    }
    Ok(None)
}

/// The seq a publish tries first: above every seq anyone wrote. Should that be the last seq
/// there is (a record planted at `MAX_SEQ`), above its own base instead: the slots between are
/// taken or not like any other, and readers pass the planted record over.
fn first_seq_to_write(occupied: Option<u64>, base: Option<&HeadRecord>) -> u64 {
    match occupied {
        None => 1,
        Some(s) if s < catalog::MAX_SEQ => s + 1,
        Some(_) => base.map_or(1, |b| b.seq + 1),
    }
}

/// The manifest of `id` as a parent, and whether it had to be repaired: `None` if it is missing or
/// does not decode (a corrupt manifest must not block every later publish); files held in packs
/// the store no longer has are dropped from it.
fn usable_parent(
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

#[cfg(test)]
mod tests;
