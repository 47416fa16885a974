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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::catalog::KeyLayout;
use crate::catalog::{self, CatalogError, now_secs, writer_id};
use crate::facts::Facts;
use crate::generation::{
    Chunk, CompatId, Conflict, ContentHash, FORMAT_VERSION, FileRecord, GenerationId, HeadRecord,
    Manifest, PackPlan, PackRef, Producer, RelPath, hash_file, merge_files, plan_packs,
    prune_packs,
};
use crate::policy::{CachePolicy, Decision, PolicyError, ReasonCategory, Verdict};
use crate::scan::{self, ScannedFile};
use crate::store::{Store, StoreError, ValueClass};
use crate::trust::PublishTrust;

#[derive(Debug, Clone)]
pub struct PublishOptions {
    pub pack_size: u64,
    pub producer: Producer,
    pub facts: Facts,
    /// Head seqs to try before giving up when other publishers keep winning.
    pub max_head_attempts: u32,
    /// The key heads are signed with, and which heads may be built on and merged.
    pub trust: PublishTrust,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum PublishOutcome {
    /// A new generation is the head.
    Published { generation: GenerationId, seq: u64 },
    /// The head already holds every selected file.
    Unchanged { generation: GenerationId },
    /// Nothing publishable under the root and no head yet.
    Empty,
}

#[derive(Debug, Clone, Serialize)]
pub struct PublishReport {
    pub cache_kind: String,
    pub root: PathBuf,
    pub compat_key: String,
    pub compat_id: CompatId,
    #[serde(flatten)]
    pub outcome: PublishOutcome,
    pub files_selected: u64,
    /// Files not published, by category (`ReasonCategory`: a small fixed set, so summaries and
    /// metric labels stay bounded whatever the tree holds).
    pub skipped: BTreeMap<ReasonCategory, u64>,
    /// Which files were skipped and why in words: the first `MAX_SKIP_DETAILS` of them, for `-v`
    /// and reports (never for metric labels).
    pub skip_details: Vec<SkipDetail>,
    /// Why the root is not a complete cache for its kind (the policy's `incomplete-detail`); the
    /// generation published from it is recorded as incomplete. `None` = complete.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// Selected files the parent generation did not have.
    pub files_new: u64,
    pub files_hashed: u64,
    pub bytes_uploaded: u64,
    /// Bytes of packs this publish needed that the store already held (other pods, crashed runs).
    pub bytes_deduplicated: u64,
    pub packs_uploaded: u64,
    pub packs_reused: u64,
    pub conflicts: Vec<Conflict>,
    /// Generations of other publishers merged in because they won a head seq first.
    pub merged: Vec<GenerationId>,
    /// Key id of the key the new head was signed with (None: unsigned).
    pub signed_by: Option<String>,
    /// Who signed the head this publish built on (None: no parent).
    pub parent_signer: Option<crate::trust::Signer>,
    /// Time spent hashing files, and reading and uploading packs (where a publish's time goes).
    pub hash_ms: u64,
    pub upload_ms: u64,
    pub duration_ms: u64,
}

/// Most skipped files `PublishReport::skip_details` lists (the counts by category are complete).
pub const MAX_SKIP_DETAILS: usize = 100;

/// One skipped file, for `-v` and reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkipDetail {
    pub path: String,
    pub category: ReasonCategory,
    pub detail: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("policy {policy}: {source}")]
    Policy { policy: String, source: PolicyError },
    #[error("policy {0} returned {1} decisions for {2} files")]
    PolicyContract(String, usize, usize),
    #[error("scanning {root}: {source}")]
    Scan {
        root: PathBuf,
        source: std::io::Error,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The policy refused or failed to give the root-independent form of a file it said embeds
    /// the root.
    #[error("policy could not canonicalize {path}: {source}")]
    Canonicalize { path: RelPath, source: PolicyError },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(
        "gave up after {0} attempts to write a head: other publishers kept winning; retry later"
    )]
    Contention(u32),
    #[error(
        "trust mode is required but no signing key is configured: set trust.signing_key_file, \
         --signing-key or JITSHIP_SIGNING_KEY_FILE (make a key with `jitship key generate`), or \
         every generation this publisher writes would be refused"
    )]
    NoSigningKey,
    #[error("cache root {0} does not exist: check the path (or the volume mount)")]
    RootMissing(PathBuf),
    #[error("cache root {0} is not a directory")]
    RootNotDir(PathBuf),
}

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

/// Remembers file hashes between publishes of one root (the watcher keeps one), keyed by path and
/// checked against size, mtime and inode, so an unchanged file is never hashed (or canonicalized)
/// twice.
#[derive(Debug, Default)]
pub struct HashCache {
    entries: HashMap<RelPath, (u64, i64, u32, u64, Stored)>,
}

impl HashCache {
    fn lookup(&self, f: &ScannedFile) -> Option<Stored> {
        let &(size, s, ns, ino, stored) = self.entries.get(&f.path)?;
        (size == f.size && s == f.mtime_s && ns == f.mtime_ns && ino == f.ino).then_some(stored)
    }

    fn remember(&mut self, f: &ScannedFile, stored: Stored) {
        self.entries.insert(
            f.path.clone(),
            (f.size, f.mtime_s, f.mtime_ns, f.ino, stored),
        );
    }
}

/// What a selected file is stored as: its bytes, or for a file whose decision says it embeds the
/// root, the policy's root-independent form of them (so pods at different roots store the same
/// bytes once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stored {
    hash: ContentHash,
    size: u64,
    canonical: bool,
}

/// Largest file jitship canonicalizes (files that embed the root are small metadata: Triton
/// groups are a few KiB); a larger one is refused rather than read whole into memory.
const CANONICALIZE_LIMIT: u64 = 16 << 20;

/// The root-independent form of `f` (`policy.canonicalize` on its whole content).
fn canonical_bytes(
    policy: &dyn CachePolicy,
    root: &Path,
    f: &ScannedFile,
) -> Result<Vec<u8>, PublishError> {
    let path = f.path.to_path(root);
    let read_err = |source| PublishError::Read {
        path: path.clone(),
        source,
    };
    if f.size > CANONICALIZE_LIMIT {
        return Err(read_err(std::io::Error::other(format!(
            "{} bytes: too large for a file that embeds the cache root (limit {CANONICALIZE_LIMIT})",
            f.size
        ))));
    }
    let bytes = std::fs::read(&path).map_err(read_err)?;
    if bytes.len() as u64 != f.size {
        return Err(read_err(std::io::Error::other(
            "file changed while it was read; retry the publish",
        )));
    }
    policy
        .canonicalize(root, &f.path, &bytes)
        .map_err(|source| PublishError::Canonicalize {
            path: f.path.clone(),
            source,
        })
}

pub fn publish(
    store: &dyn Store,
    layout: &KeyLayout,
    policy: &dyn CachePolicy,
    root: &Path,
    opts: &PublishOptions,
    hashes: &mut HashCache,
) -> Result<PublishReport, PublishError> {
    let started = Instant::now();
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
    };

    let newest = catalog::newest_head(store, layout, &compat_id)?;
    // Under `required`, a head this publisher's trust refuses is no parent: build on the newest
    // admitted one below it, and publish even if nothing is new, so a signed head covers it.
    let head = match &newest {
        Some(h) => admitted_base(store, layout, h, &opts.trust)?,
        None => None,
    };
    let covers_refused_head = newest.as_ref().map(|h| h.seq) != head.as_ref().map(|h| h.seq);
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
    let local = hash_selected(
        policy,
        root,
        &selected,
        parent.as_ref(),
        hashes,
        &kept,
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
    let parent_contents: HashMap<ContentHash, (&[Chunk], &[PackRef])> = parent
        .iter()
        .flat_map(|m| {
            m.files
                .iter()
                .map(move |f| (f.blake3, (f.chunks.as_slice(), m.packs.as_slice())))
        })
        .collect();
    let mut order: Vec<(ContentHash, u64)> = Vec::new();
    let mut source_of: HashMap<ContentHash, (&ScannedFile, Stored)> = HashMap::new();
    for (f, s) in &new_files {
        if !parent_contents.contains_key(&s.hash) && !source_of.contains_key(&s.hash) {
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
        root,
        &plans,
        &source_of,
        &kept,
        &mut report,
    )?;
    report.upload_ms = uploading.elapsed().as_millis() as u64;

    // Our side: the new files, located in parent packs or in the packs just uploaded.
    let mut ours_packs: Vec<PackRef> = parent.as_ref().map(|m| m.packs.clone()).unwrap_or_default();
    let base = ours_packs.len() as u32;
    ours_packs.extend(plans.iter().map(|p| PackRef {
        id: p.id,
        size: p.size,
    }));
    let mut located: HashMap<ContentHash, Vec<Chunk>> = HashMap::new();
    for (i, plan) in plans.iter().enumerate() {
        for piece in &plan.pieces {
            located.entry(piece.content).or_default().push(Chunk {
                pack: base + i as u32,
                offset: piece.pack_offset,
                len: piece.len,
            });
        }
    }
    let ours_files: Vec<FileRecord> = new_files
        .iter()
        .map(|(f, s)| FileRecord {
            path: f.path.clone(),
            size: s.size,
            mode: f.mode,
            mtime_s: f.mtime_s,
            mtime_ns: f.mtime_ns,
            blake3: s.hash,
            chunks: match parent_contents.get(&s.hash) {
                Some((chunks, _)) => chunks.to_vec(),
                None => located.get(&s.hash).cloned().unwrap_or_default(),
            },
            marker: markers.contains(&f.path),
            canonical: s.canonical,
        })
        .collect();

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

    // The compat index lets gc and `ls` find this compat id on stores that cannot list keys; it is
    // written before the head, so no head exists that the index does not lead to.
    catalog::ensure_indexed(
        store,
        layout,
        &compat_id,
        &candidate.cache_kind,
        &candidate.compat_key,
    )?;
    let (generation, seq) = commit_head(
        store,
        layout,
        candidate,
        newest.map_or(1, |h| h.seq + 1),
        opts,
        &mut report,
    )?;
    report.outcome = PublishOutcome::Published { generation, seq };
    report.signed_by = opts
        .trust
        .signing_key
        .as_ref()
        .map(|k| k.key_id().to_owned());
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// `newest`, or if the trust refuses it the newest admitted head below it (None: start a fresh chain).
fn admitted_base(
    store: &dyn Store,
    layout: &KeyLayout,
    newest: &HeadRecord,
    trust: &PublishTrust,
) -> Result<Option<HeadRecord>, PublishError> {
    if trust.admits(layout.namespace(), newest) {
        return Ok(Some(newest.clone()));
    }
    // Bounded: a store flooded with refused heads costs a publish a fresh chain, not a long walk.
    const MAX_REFUSED: usize = 64;
    let below = catalog::older_heads(store, layout, newest, MAX_REFUSED)?;
    let base = below
        .into_iter()
        .find(|h| trust.admits(layout.namespace(), h));
    tracing::warn!(
        seq = newest.seq,
        generation = %newest.generation,
        base = ?base.as_ref().map(|h| h.seq),
        "the newest head is not trusted: building on the newest trusted head below it and writing above it"
    );
    Ok(base)
}

/// The manifest of `id` as a parent, and whether it had to be repaired: `None` if it is missing or
/// does not decode (a corrupt manifest must not block every later publish); files held in packs
/// the store no longer has are dropped from it.
fn usable_parent(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
) -> Result<(Option<Manifest>, bool), PublishError> {
    let mut manifest = match catalog::fetch_manifest(store, layout, id) {
        Ok(Some(m)) => m,
        Ok(None) => return Ok((None, false)),
        Err(CatalogError::Manifest { id, source }) => {
            tracing::warn!(generation = %id, error = %source, "the head's manifest is corrupt; publishing a fresh chain");
            return Ok((None, false));
        }
        Err(e) => return Err(e.into()),
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

/// Hashes of the selected files: from the hash cache, from the parent manifest when size and
/// mtime match, otherwise by reading the file (in parallel). A file that embeds the root
/// (`embeds_root` in its decision) is hashed in its canonical form, never taken from the parent
/// by size (the parent's size is that of the canonical bytes).
fn hash_selected<'a>(
    policy: &dyn CachePolicy,
    root: &Path,
    selected: &[(&'a ScannedFile, bool)],
    parent: Option<&Manifest>,
    cache: &mut HashCache,
    kept: &KeptContents,
    report: &mut PublishReport,
) -> Result<Vec<(&'a ScannedFile, Stored)>, PublishError> {
    let known: HashMap<&RelPath, &FileRecord> = parent
        .iter()
        .flat_map(|m| &m.files)
        .map(|f| (&f.path, f))
        .collect();
    let results: Vec<Result<(Stored, bool), PublishError>> = selected
        .par_iter()
        .map(|&(f, embeds_root)| {
            if let Some(s) = cache.lookup(f).filter(|s| s.canonical == embeds_root) {
                return Ok((s, false));
            }
            if embeds_root {
                let bytes = canonical_bytes(policy, root, f)?;
                let stored = Stored {
                    hash: ContentHash::of(&bytes),
                    size: bytes.len() as u64,
                    canonical: true,
                };
                kept.offer(stored.hash, bytes);
                return Ok((stored, true));
            }
            if let Some(p) = known.get(&f.path).filter(|p| {
                !p.canonical
                    && p.size == f.size
                    && p.mtime_s == f.mtime_s
                    && p.mtime_ns == f.mtime_ns
            }) {
                let stored = Stored {
                    hash: p.blake3,
                    size: p.size,
                    canonical: false,
                };
                return Ok((stored, false));
            }
            let path = f.path.to_path(root);
            let read_err = |source| PublishError::Read {
                path: path.clone(),
                source,
            };
            let (hash, len) = if kept.reserve(f.size) {
                // Small enough to keep: read whole, hashed from memory, and packed from memory.
                let bytes = std::fs::read(&path).map_err(read_err)?;
                let (hash, len) = (ContentHash::of(&bytes), bytes.len() as u64);
                kept.keep(hash, bytes, f.size);
                (hash, len)
            } else {
                hash_file(&path).map_err(read_err)?
            };
            if len != f.size {
                return Err(PublishError::Read {
                    path,
                    source: std::io::Error::other(
                        "file changed while it was hashed; retry the publish",
                    ),
                });
            }
            let stored = Stored {
                hash,
                size: len,
                canonical: false,
            };
            Ok((stored, true))
        })
        .collect();
    let mut out = Vec::with_capacity(selected.len());
    for ((f, _), r) in selected.iter().zip(results) {
        let (stored, hashed) = r?;
        report.files_hashed += u64::from(hashed);
        cache.remember(f, stored);
        out.push((*f, stored));
    }
    Ok(out)
}

/// Uploads the packs the store lacks. Two workers each fill a pack in place (in a Mooncake
/// staging buffer: `Store::put_filled`) and put it, so one reads files while the other uploads:
/// at most two pack buffers exist at once, whatever the tree size.
#[allow(clippy::too_many_arguments)]
fn upload_packs(
    store: &dyn Store,
    layout: &KeyLayout,
    policy: &dyn CachePolicy,
    root: &Path,
    plans: &[PackPlan],
    source_of: &HashMap<ContentHash, (&ScannedFile, Stored)>,
    kept: &KeptContents,
    report: &mut PublishReport,
) -> Result<(), PublishError> {
    let keys: Vec<String> = plans.iter().map(|p| layout.pack(&p.id)).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut missing = Vec::new();
    for (i, present) in store.exists_batch(&key_refs).into_iter().enumerate() {
        if present? {
            report.packs_reused += 1;
            report.bytes_deduplicated += plans[i].size;
        } else {
            missing.push(&plans[i]);
        }
    }
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let upload = || -> Result<(u64, u64), PublishError> {
        let (mut packs, mut bytes) = (0, 0);
        while !failed.load(Ordering::Relaxed) {
            let Some(plan) = missing.get(next.fetch_add(1, Ordering::Relaxed)) else {
                break;
            };
            let mut fill_error = None;
            let stored = store.put_filled(
                &layout.pack(&plan.id),
                plan.size as usize,
                ValueClass::Bulk,
                &mut |buf| {
                    fill_pack(policy, root, plan, source_of, kept, buf)
                        .map_err(|e| fill_error = Some(e))
                        .is_ok()
                },
            );
            match (stored, fill_error) {
                (_, Some(e)) => return Err(e),
                (Err(e), None) => return Err(e.into()),
                (Ok(_), None) => {
                    packs += 1;
                    bytes += plan.size;
                }
            }
        }
        Ok((packs, bytes))
    };
    let worker = || {
        let r = upload();
        if r.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        r
    };
    let results = std::thread::scope(|scope| {
        let other = scope.spawn(worker);
        let mine = worker();
        [mine, other.join().expect("pack upload worker panicked")]
    });
    for r in results {
        let (packs, bytes) = r?;
        report.packs_uploaded += packs;
        report.bytes_uploaded += bytes;
    }
    Ok(())
}

fn fill_pack(
    policy: &dyn CachePolicy,
    root: &Path,
    plan: &PackPlan,
    source_of: &HashMap<ContentHash, (&ScannedFile, Stored)>,
    kept: &KeptContents,
    buf: &mut [u8],
) -> Result<(), PublishError> {
    for piece in &plan.pieces {
        let (f, stored) = source_of[&piece.content];
        let path = f.path.to_path(root);
        let read_err = |source| PublishError::Read {
            path: path.clone(),
            source,
        };
        let dst = &mut buf[piece.pack_offset as usize..(piece.pack_offset + piece.len) as usize];
        if kept.copy_piece(&piece.content, piece.content_offset, dst) {
            continue;
        }
        if stored.canonical {
            // Canonicalized again rather than kept from hashing (memory stays bounded); the hash
            // says whether the file is still what was hashed.
            let bytes = canonical_bytes(policy, root, f)?;
            if ContentHash::of(&bytes) != stored.hash {
                return Err(read_err(std::io::Error::other(
                    "file changed while it was published; retry the publish",
                )));
            }
            let from = piece.content_offset as usize;
            dst.copy_from_slice(&bytes[from..from + piece.len as usize]);
            continue;
        }
        let mut file = std::fs::File::open(&path).map_err(read_err)?;
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(piece.content_offset))
            .map_err(read_err)?;
        file.read_exact(dst).map_err(read_err)?;
        // The bytes were hashed earlier; if the file changed since, the hash would lie. Caches
        // write by rename, so size, mtime and inode catch a change.
        if !f.unchanged_on_disk(root) {
            return Err(PublishError::Read {
                path,
                source: std::io::Error::other(
                    "file changed while it was published; retry the publish",
                ),
            });
        }
    }
    Ok(())
}

/// Largest file whose content publish keeps from hashing to packing.
const KEEP_FILE_LIMIT: u64 = 1 << 20;

/// Contents read while hashing, kept for the pack that uploads them, so a small file (most of a
/// kernel cache) is read and canonicalized once, not twice. At most `budget` bytes are kept (one
/// pack's worth: peak memory grows by at most one pack); the rest are read again when their pack
/// is filled and checked then. A kept content is dropped once its last piece is packed.
struct KeptContents {
    left: AtomicU64,
    contents: Mutex<HashMap<ContentHash, Vec<u8>>>,
}

impl KeptContents {
    fn new(budget: u64) -> Self {
        Self {
            left: AtomicU64::new(budget),
            contents: Mutex::new(HashMap::new()),
        }
    }

    /// Takes `size` bytes of the budget for a file about to be read, if it is small and fits.
    fn reserve(&self, size: u64) -> bool {
        size <= KEEP_FILE_LIMIT
            && self
                .left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                    left.checked_sub(size)
                })
                .is_ok()
    }

    /// Keeps `bytes` read under a reservation of `reserved` bytes (returned if not kept: the
    /// content is already kept, from an identical file).
    fn keep(&self, hash: ContentHash, bytes: Vec<u8>, reserved: u64) {
        let mut contents = self.contents.lock().unwrap_or_else(|e| e.into_inner());
        match contents.entry(hash) {
            std::collections::hash_map::Entry::Occupied(_) => {
                self.left.fetch_add(reserved, Ordering::Relaxed);
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(bytes);
            }
        }
    }

    /// Keeps a canonical form computed while hashing, if it fits the budget.
    fn offer(&self, hash: ContentHash, bytes: Vec<u8>) {
        let size = bytes.len() as u64;
        if self.reserve(size) {
            self.keep(hash, bytes, size);
        }
    }

    /// Copies the piece of a kept content at `offset` into `dst`; false if it is not kept.
    fn copy_piece(&self, hash: &ContentHash, offset: u64, dst: &mut [u8]) -> bool {
        let mut contents = self.contents.lock().unwrap_or_else(|e| e.into_inner());
        let Some(bytes) = contents.get(hash) else {
            return false;
        };
        let (from, to) = (offset as usize, offset as usize + dst.len());
        dst.copy_from_slice(&bytes[from..to]);
        if to == bytes.len() {
            contents.remove(hash);
        }
        true
    }
}

/// Puts the manifest and the head at `seq`; if another publisher won `seq`, merges onto its
/// generation and tries the next seq.
///
/// Union (invariant 4) holds because every head we write includes the generations of all heads
/// between our parent's seq and ours: a seq we lose is merged before we move on, and after we win a
/// seq the head just below it is checked once more: if it holds a generation we never merged (its
/// put was still in flight when we read that seq back), we merge it and write the next seq.
fn commit_head(
    store: &dyn Store,
    layout: &KeyLayout,
    mut candidate: Manifest,
    mut seq: u64,
    opts: &PublishOptions,
    report: &mut PublishReport,
) -> Result<(GenerationId, u64), PublishError> {
    let writer = writer_id();
    let base_seq = seq.saturating_sub(1);
    let mut included: HashSet<GenerationId> = candidate.parent.into_iter().collect();
    for _ in 0..opts.max_head_attempts {
        candidate.normalize();
        let bytes = candidate.encode();
        let generation = candidate.id();
        store.put(&layout.generation(&generation), &bytes, ValueClass::Record)?;
        let mut record = HeadRecord {
            compat_id: candidate.compat_id,
            seq,
            generation,
            written_at: now_secs(),
            writer: writer.clone(),
            signature: None,
        };
        if let Some(key) = &opts.trust.signing_key {
            key.sign(layout.namespace(), &mut record);
        }
        let admits = |h: &HeadRecord| opts.trust.admits(layout.namespace(), h);
        let Some(stored) = put_and_read_back(store, layout, &record)? else {
            // Nobody's head is readable at this seq even after retries (evicted at once): write
            // above it; the check below merges it if it shows up after all.
            tracing::warn!(
                seq,
                "head record unreadable right after writing it; trying the next seq"
            );
            seq += 1;
            continue;
        };
        // Another publisher of the same generation counts as ours only if its head is admitted.
        if stored == record || (stored.generation == generation && admits(&stored)) {
            included.insert(generation);
            // Won. A head below ours that we never merged (its put was in flight when we read its
            // seq back) would be superseded without its files: merge it and write the next seq.
            let below = seq - 1;
            let missed = if below > base_seq {
                // A refused head below needs no merging: ours supersedes it.
                catalog::read_head(store, layout, &candidate.compat_id, below)?
                    .filter(|h| !included.contains(&h.generation) && admits(h))
            } else {
                None
            };
            let Some(missed) = missed else {
                // And a head above ours written by someone who did not see ours (our put was the
                // one in flight): merge onto it and write above it.
                let Some(above) =
                    head_above_without(store, layout, &candidate, seq, generation, &opts.trust)?
                else {
                    return Ok((generation, seq));
                };
                tracing::info!(seq = seq + 1, generation = %above.0, "a head above ours does not include ours; merging onto it");
                included.insert(above.0);
                if let Some(other) = above.1
                    && merge_onto(&mut candidate, &other, generation, report)
                {
                    return Ok((other.id(), seq + 1));
                }
                seq += 2;
                continue;
            };
            tracing::info!(seq = below, generation = %missed.generation, "a head below ours was never merged; merging it");
            included.insert(missed.generation);
            if let Some(other) = winner_manifest(store, layout, &missed.generation)? {
                let (files, packs, conflicts) = merge_files(
                    &candidate.files,
                    &candidate.packs,
                    &other.files,
                    &other.packs,
                );
                report.conflicts.extend(conflicts);
                report.merged.push(other.id());
                candidate.merged.push(other.id());
                candidate.parent = Some(generation);
                candidate.files = files;
                candidate.packs = packs;
                prune_packs(&mut candidate);
                seq += 1;
                continue;
            }
            return Ok((generation, seq));
        }
        // Another publisher won this seq: build on its generation (the union of both).
        tracing::info!(seq, winner = %stored.generation, "another publisher won the head; merging");
        included.insert(stored.generation);
        let winner = if admits(&stored) {
            winner_manifest(store, layout, &stored.generation)?
        } else {
            tracing::warn!(seq, winner = %stored.generation, "the head that won this seq is not trusted; not merging it, writing above it");
            None
        };
        if winner.is_none() {
            // Our candidate is unchanged and is written again (same id) at the next seq.
            tracing::warn!(seq, winner = %stored.generation, "the winning head's manifest is missing or corrupt; writing above it");
        }
        if let Some(winner) = winner
            && merge_onto(&mut candidate, &winner, generation, report)
        {
            return Ok((winner.id(), seq));
        }
        seq += 1;
    }
    Err(PublishError::Contention(opts.max_head_attempts))
}

/// The head at `seq + 1` if it exists and its generation neither builds on nor merged `ours`
/// (with its manifest, when readable and the head is admitted by `trust`: a refused head above
/// ours is written over, never merged).
fn head_above_without(
    store: &dyn Store,
    layout: &KeyLayout,
    candidate: &Manifest,
    seq: u64,
    ours: GenerationId,
    trust: &PublishTrust,
) -> Result<Option<(GenerationId, Option<Manifest>)>, PublishError> {
    let Some(above) = catalog::read_head(store, layout, &candidate.compat_id, seq + 1)? else {
        return Ok(None);
    };
    if !trust.admits(layout.namespace(), &above) {
        return Ok(Some((above.generation, None)));
    }
    let manifest = winner_manifest(store, layout, &above.generation)?;
    let includes_ours = manifest
        .as_ref()
        .is_some_and(|m| m.parent == Some(ours) || m.merged.contains(&ours));
    Ok((!includes_ours).then_some((above.generation, manifest)))
}

/// Puts `record` and reads its seq back. A miss is retried with backoff, putting ours again each
/// time: on Mooncake another client's put of the same key can be in flight (our put returns as if
/// the key existed, a get still misses), and deciding "nobody holds this seq" too early would skip
/// that publisher's files. `None` only if the seq stays unreadable.
fn put_and_read_back(
    store: &dyn Store,
    layout: &KeyLayout,
    record: &HeadRecord,
) -> Result<Option<HeadRecord>, PublishError> {
    let key = layout.head(&record.compat_id, record.seq);
    let bytes = record.encode();
    for attempt in 0..8u32 {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(25 << attempt.min(4)));
        }
        store.put(&key, &bytes, ValueClass::Record)?;
        if let Some(stored) = catalog::read_head(store, layout, &record.compat_id, record.seq)? {
            return Ok(Some(stored));
        }
    }
    Ok(None)
}

/// A winning (or missed) head's manifest; `None` if it is missing or corrupt (it cannot be merged,
/// and the next seq supersedes it).
fn winner_manifest(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
) -> Result<Option<Manifest>, PublishError> {
    match catalog::fetch_manifest(store, layout, id) {
        Ok(m) => Ok(m),
        Err(CatalogError::Manifest { id, source }) => {
            tracing::warn!(generation = %id, error = %source, "a head's manifest is corrupt; it cannot be merged");
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Rebuilds `candidate` (whose previous id was `ours`) on top of `base`, another publisher's
/// generation: the union of both, `base` winning conflicting paths. True if the result holds
/// nothing `base` lacks, so `base` itself is the answer.
fn merge_onto(
    candidate: &mut Manifest,
    base: &Manifest,
    ours: GenerationId,
    report: &mut PublishReport,
) -> bool {
    let (files, packs, conflicts) =
        merge_files(&base.files, &base.packs, &candidate.files, &candidate.packs);
    report.conflicts.extend(conflicts);
    report.merged.push(base.id());
    candidate.parent = Some(base.id());
    candidate.merged.push(ours);
    candidate.files = files;
    candidate.packs = packs;
    prune_packs(candidate);
    candidate.files == base.files
}

#[cfg(test)]
mod tests;
