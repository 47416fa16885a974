//! Publishing a cache root as a generation.
//!
//! Order of writes (invariant 1): packs, then the manifest, then the head record. A reader only
//! finds generations through heads, so a crash anywhere leaves nothing visible; the packs and
//! manifest already written are reused by the next publish (puts of existing keys are no-ops) or
//! collected by gc.
//!
//! Steps: scan -> policy.select -> read the newest head and its manifest (the parent) -> hash the
//! selected files not already known -> merge onto the parent -> plan packs for contents the parent
//! lacks -> upload the packs the store lacks -> put manifest -> put head seq+1, read it back, and if
//! another publisher won that seq, merge onto its generation and try the next seq.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use rayon::prelude::*;
use serde::Serialize;

use crate::catalog::{self, CatalogError};
use crate::facts::Facts;
use crate::generation::{
    Chunk, CompatId, Conflict, ContentHash, FORMAT_VERSION, FileRecord, GenerationId, HeadRecord,
    Manifest, PackPlan, PackRef, Producer, RelPath, hash_file, merge_files, plan_packs,
    prune_packs,
};
use crate::policy::{CachePolicy, PolicyError, Verdict};
use crate::scan::{self, ScannedFile};
use crate::store::{KeyLayout, Store, StoreError};

#[derive(Debug, Clone)]
pub struct PublishOptions {
    pub pack_size: u64,
    pub producer: Producer,
    pub facts: Facts,
    /// Head seqs to try before giving up when other publishers keep winning.
    pub max_head_attempts: u32,
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
    /// Files not published, by reason.
    pub skipped: BTreeMap<String, u64>,
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
    /// Time spent hashing files, and reading and uploading packs (where a publish's time goes).
    pub hash_ms: u64,
    pub upload_ms: u64,
    pub duration_ms: u64,
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
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(
        "gave up after {0} attempts to write a head: other publishers kept winning; retry later"
    )]
    Contention(u32),
}

/// Remembers file hashes between publishes of one root (the watcher keeps one), keyed by path and
/// checked against size, mtime and inode, so an unchanged file is never hashed twice.
#[derive(Debug, Default)]
pub struct HashCache {
    entries: HashMap<RelPath, (u64, i64, u32, u64, ContentHash)>,
}

impl HashCache {
    fn lookup(&self, f: &ScannedFile) -> Option<ContentHash> {
        let &(size, s, ns, ino, hash) = self.entries.get(&f.path)?;
        (size == f.size && s == f.mtime_s && ns == f.mtime_ns && ino == f.ino).then_some(hash)
    }

    fn remember(&mut self, f: &ScannedFile, hash: ContentHash) {
        self.entries
            .insert(f.path.clone(), (f.size, f.mtime_s, f.mtime_ns, f.ino, hash));
    }
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
    let kind = policy.info().cache_kind.clone();
    let policy_err = |source| PublishError::Policy {
        policy: policy.info().name.clone(),
        source,
    };
    let compat_key = policy.compat_key(&opts.facts).map_err(policy_err)?;
    let compat_id = CompatId::new(&kind, &compat_key);

    let snap = scan::snapshot(root).map_err(|source| PublishError::Scan {
        root: root.into(),
        source,
    })?;
    let entries: Vec<_> = snap.files.iter().map(ScannedFile::entry).collect();
    let decisions = policy.select(root, &entries).map_err(policy_err)?;
    if decisions.len() != entries.len() {
        return Err(PublishError::PolicyContract(
            policy.info().name.clone(),
            decisions.len(),
            entries.len(),
        ));
    }
    let mut skipped: BTreeMap<String, u64> = BTreeMap::new();
    for (_, reason) in &snap.unpublishable {
        *skipped.entry((*reason).to_owned()).or_default() += 1;
    }
    let selected: Vec<&ScannedFile> = snap
        .files
        .iter()
        .zip(&decisions)
        .filter_map(|(f, d)| match d.verdict {
            Verdict::Publish => Some(f),
            Verdict::Skip => {
                *skipped.entry(d.reason.clone()).or_default() += 1;
                None
            }
        })
        .collect();

    let mut report = PublishReport {
        cache_kind: kind.clone(),
        root: root.into(),
        compat_key: compat_key.clone(),
        compat_id,
        outcome: PublishOutcome::Empty,
        files_selected: selected.len() as u64,
        skipped,
        files_new: 0,
        files_hashed: 0,
        bytes_uploaded: 0,
        bytes_deduplicated: 0,
        packs_uploaded: 0,
        packs_reused: 0,
        conflicts: vec![],
        merged: vec![],
        hash_ms: 0,
        upload_ms: 0,
        duration_ms: 0,
    };

    let head = catalog::newest_head(store, layout, &compat_id)?;
    // A head whose manifest was evicted is no parent: this publish starts a fresh chain above it.
    let parent = match &head {
        Some(h) => catalog::fetch_manifest(store, layout, &h.generation)?,
        None => None,
    };

    let hashing = Instant::now();
    let local = hash_selected(root, &selected, parent.as_ref(), hashes, &mut report)?;
    report.hash_ms = hashing.elapsed().as_millis() as u64;
    let parent_paths: HashMap<&RelPath, &FileRecord> = parent
        .iter()
        .flat_map(|m| &m.files)
        .map(|f| (&f.path, f))
        .collect();
    let new_files: Vec<&(&ScannedFile, ContentHash)> = local
        .iter()
        .filter(|(f, _)| !parent_paths.contains_key(&f.path))
        .collect();
    report.files_new = new_files.len() as u64;
    if new_files.is_empty() {
        report.conflicts = local
            .iter()
            .filter_map(|(f, h)| {
                let p = parent_paths.get(&f.path)?;
                (p.blake3 != *h).then(|| Conflict {
                    path: f.path.clone(),
                    kept: p.blake3,
                    dropped: *h,
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
    let mut source_of: HashMap<ContentHash, &ScannedFile> = HashMap::new();
    for (f, h) in &new_files {
        if !parent_contents.contains_key(h) && !source_of.contains_key(h) {
            source_of.insert(*h, f);
            order.push((*h, f.size));
        }
    }
    let plans = plan_packs(&order, opts.pack_size);
    let uploading = Instant::now();
    upload_packs(store, layout, root, &plans, &source_of, &mut report)?;
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
        .map(|(f, h)| FileRecord {
            path: f.path.clone(),
            size: f.size,
            mode: f.mode,
            mtime_s: f.mtime_s,
            mtime_ns: f.mtime_ns,
            blake3: *h,
            chunks: match parent_contents.get(h) {
                Some((chunks, _)) => chunks.to_vec(),
                None => located.get(h).cloned().unwrap_or_default(),
            },
        })
        .collect();

    let mut candidate = Manifest {
        format: FORMAT_VERSION,
        cache_kind: kind,
        compat_key,
        compat_id,
        facts: opts.facts.as_map().clone(),
        policy: policy.policy_ref(),
        parent: parent.as_ref().map(Manifest::id),
        merged: vec![],
        producer: opts.producer.clone(),
        created_at: now_secs(),
        packs: vec![],
        files: vec![],
    };
    let (files, packs, conflicts) = match &parent {
        Some(p) => merge_files(&p.files, &p.packs, &ours_files, &ours_packs),
        None => merge_files(&[], &[], &ours_files, &ours_packs),
    };
    candidate.files = files;
    candidate.packs = packs;
    report.conflicts.extend(conflicts);
    prune_packs(&mut candidate);

    let (generation, seq) = commit_head(
        store,
        layout,
        candidate,
        head.map_or(1, |h| h.seq + 1),
        opts,
        &mut report,
    )?;
    report.outcome = PublishOutcome::Published { generation, seq };
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// Hashes of the selected files: from the hash cache, from the parent manifest when size and
/// mtime match, otherwise by reading the file (in parallel).
fn hash_selected<'a>(
    root: &Path,
    selected: &[&'a ScannedFile],
    parent: Option<&Manifest>,
    cache: &mut HashCache,
    report: &mut PublishReport,
) -> Result<Vec<(&'a ScannedFile, ContentHash)>, PublishError> {
    let known: HashMap<&RelPath, &FileRecord> = parent
        .iter()
        .flat_map(|m| &m.files)
        .map(|f| (&f.path, f))
        .collect();
    let results: Vec<Result<(ContentHash, bool), PublishError>> = selected
        .par_iter()
        .map(|f| {
            if let Some(h) = cache.lookup(f) {
                return Ok((h, false));
            }
            if let Some(p) = known
                .get(&f.path)
                .filter(|p| p.size == f.size && p.mtime_s == f.mtime_s && p.mtime_ns == f.mtime_ns)
            {
                return Ok((p.blake3, false));
            }
            let path = f.path.to_path(root);
            let (hash, len) = hash_file(&path).map_err(|source| PublishError::Read {
                path: path.clone(),
                source,
            })?;
            if len != f.size {
                return Err(PublishError::Read {
                    path,
                    source: std::io::Error::other(
                        "file changed while it was hashed; retry the publish",
                    ),
                });
            }
            Ok((hash, true))
        })
        .collect();
    let mut out = Vec::with_capacity(selected.len());
    for (f, r) in selected.iter().zip(results) {
        let (hash, hashed) = r?;
        report.files_hashed += u64::from(hashed);
        cache.remember(f, hash);
        out.push((*f, hash));
    }
    Ok(out)
}

/// Uploads the packs the store lacks. A reader thread fills the next pack while this thread
/// uploads the current one: at most three pack buffers exist at once, whatever the tree size.
fn upload_packs(
    store: &dyn Store,
    layout: &KeyLayout,
    root: &Path,
    plans: &[PackPlan],
    source_of: &HashMap<ContentHash, &ScannedFile>,
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
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::sync_channel::<Result<(usize, Vec<u8>), PublishError>>(1);
        let missing_ref = &missing;
        scope.spawn(move || {
            for (i, plan) in missing_ref.iter().enumerate() {
                let r = fill_pack(root, plan, source_of).map(|bytes| (i, bytes));
                let failed = r.is_err();
                if tx.send(r).is_err() || failed {
                    return;
                }
            }
        });
        for received in rx {
            let (i, bytes) = received?;
            store.put(&layout.pack(&missing[i].id), &bytes)?;
            report.packs_uploaded += 1;
            report.bytes_uploaded += bytes.len() as u64;
        }
        Ok(())
    })
}

fn fill_pack(
    root: &Path,
    plan: &PackPlan,
    source_of: &HashMap<ContentHash, &ScannedFile>,
) -> Result<Vec<u8>, PublishError> {
    let mut buf = vec![0u8; plan.size as usize];
    for piece in &plan.pieces {
        let f = source_of[&piece.content];
        let path = f.path.to_path(root);
        let read_err = |source| PublishError::Read {
            path: path.clone(),
            source,
        };
        let mut file = std::fs::File::open(&path).map_err(read_err)?;
        let dst = &mut buf[piece.pack_offset as usize..(piece.pack_offset + piece.len) as usize];
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
    Ok(buf)
}

/// Puts the manifest and the head at `seq`; if another publisher won `seq`, merges onto its
/// generation and tries the next seq.
fn commit_head(
    store: &dyn Store,
    layout: &KeyLayout,
    mut candidate: Manifest,
    mut seq: u64,
    opts: &PublishOptions,
    report: &mut PublishReport,
) -> Result<(GenerationId, u64), PublishError> {
    let writer = format!(
        "{}/{}/{}",
        opts.producer.host,
        std::process::id(),
        ContentHash::of(&nonce()).to_hex()
    );
    for _ in 0..opts.max_head_attempts {
        candidate.normalize();
        let bytes = candidate.encode();
        let generation = candidate.id();
        store.put(&layout.generation(&generation), &bytes)?;
        let record = HeadRecord {
            compat_id: candidate.compat_id,
            seq,
            generation,
            written_at: now_secs(),
            writer: writer.clone(),
        };
        let key = layout.head(&candidate.compat_id, seq);
        store.put(&key, &record.encode())?;
        let Some(stored) = catalog::read_head(store, layout, &candidate.compat_id, seq)? else {
            // Written and already gone (evicted): write it again at the next seq.
            seq += 1;
            continue;
        };
        if stored == record || stored.generation == generation {
            return Ok((generation, seq));
        }
        // Another publisher won this seq: build on its generation (the union of both).
        tracing::info!(seq, winner = %stored.generation, "another publisher won the head; merging");
        if let Some(winner) = catalog::fetch_manifest(store, layout, &stored.generation)? {
            let (files, packs, conflicts) = merge_files(
                &winner.files,
                &winner.packs,
                &candidate.files,
                &candidate.packs,
            );
            report.conflicts.extend(conflicts);
            report.merged.push(winner.id());
            candidate.parent = Some(winner.id());
            candidate.merged.push(generation);
            candidate.files = files;
            candidate.packs = packs;
            prune_packs(&mut candidate);
            if candidate.files == winner.files {
                return Ok((winner.id(), seq));
            }
        }
        seq += 1;
    }
    Err(PublishError::Contention(opts.max_head_attempts))
}

fn nonce() -> [u8; 32] {
    let mut buf = [0u8; 32];
    // Without randomness the pid and the clock still make a writer unique on one host.
    let _ = getrandom::fill(&mut buf);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    buf[..16]
        .iter_mut()
        .zip(t.to_le_bytes())
        .for_each(|(b, x)| *b ^= x);
    buf
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
