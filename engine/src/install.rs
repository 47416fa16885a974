//! Installing the newest generation for this worker into a cache root.
//!
//! head -> manifest (validated: relative, normalized paths; regular files only) -> diff with disk
//! -> fetch the packs holding missing files -> write them into a staging directory while hashing
//! -> verify every file's blake3 -> move into place. Invariant 2: nothing unverified ever enters
//! the root, and a failed or timed-out install leaves the root exactly as it was.
//!
//! Staging lives beside the root (same filesystem, so the final moves are renames) or, when the root
//! is a mount point of its own, in a `.jitship-staging-*` directory inside it that scans ignore.
//! A file lock beside the root serializes installers on one pod (invariant 5); the second one waits,
//! then finds the files present and reports already-current.
//!
//! Fallbacks: the newest head and up to `fallback_depth` older ones are candidates, newest first.
//! A candidate is skipped when the trust refuses its head (`crate::trust`; under `required` an
//! unsigned, untrusted or forged head), when its manifest or a pack is missing (evicted), and when
//! a pack turns out corrupt or vanishes while it is fetched (checked in staging, before anything
//! enters the root). The newest candidate left is installed; if every candidate was refused by
//! the trust the outcome is `untrusted`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File, FileTimes};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, Instant, UNIX_EPOCH};

use serde::Serialize;

use crate::catalog::{self, CatalogError};
use crate::facts::Facts;
use crate::generation::{CompatId, ContentHash, FileRecord, GenerationId, Manifest, hash_file};
use crate::policy::CachePolicy;
use crate::scan::STAGING_PREFIX;
use crate::store::{KeyLayout, Store, StoreError};
use crate::trust::{Signer, TrustPolicy};

#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// Bound on the whole install, lock wait included.
    pub deadline: Duration,
    /// How many older heads to try when the newest generation is incomplete, corrupt or refused.
    pub fallback_depth: usize,
    /// Which heads may be installed.
    pub trust: Arc<TrustPolicy>,
}

impl Default for InstallOptions {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(60),
            fallback_depth: 3,
            trust: Arc::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstallOutcome {
    Installed,
    AlreadyCurrent,
    Miss,
    Failed,
    /// Every candidate generation was refused by the trust (unsigned, untrusted or forged).
    Untrusted,
}

impl InstallOutcome {
    /// Process exit codes, one per outcome (1 and 2 stay with usage and config errors).
    pub fn exit_code(self) -> i32 {
        match self {
            Self::Installed => 0,
            Self::AlreadyCurrent => 10,
            Self::Miss => 11,
            Self::Failed => 12,
            Self::Untrusted => 14,
        }
    }

    /// Severity order used to summarize several caches in one exit code.
    pub fn severity(self) -> u8 {
        match self {
            Self::AlreadyCurrent => 0,
            Self::Installed => 1,
            Self::Miss => 2,
            Self::Untrusted => 3,
            Self::Failed => 4,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct InstallReport {
    pub cache_kind: String,
    pub root: PathBuf,
    pub outcome: InstallOutcome,
    /// Human explanation of the outcome.
    pub detail: String,
    pub compat_key: Option<String>,
    pub compat_id: Option<CompatId>,
    pub generation: Option<GenerationId>,
    /// Who signed the head of the installed generation.
    pub signer: Option<Signer>,
    /// Newer heads the trust refused (newest first).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedHead>,
    /// Newer generations given up on because a pack was corrupt or vanished while fetched.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub damaged: Vec<String>,
    pub files_in_generation: u64,
    pub files_installed: u64,
    pub bytes_installed: u64,
    pub files_already_present: u64,
    /// Paths present on disk with other content (left alone).
    pub conflicts: Vec<String>,
    pub packs_fetched: u64,
    pub bytes_fetched: u64,
    pub duration_ms: u64,
}

/// A head the trust did not admit.
#[derive(Debug, Clone, Serialize)]
pub struct RefusedHead {
    pub seq: u64,
    pub generation: GenerationId,
    pub signer: Signer,
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("pack {0} vanished from the store during the install (evicted); retry")]
    PackVanished(ContentHash),
    #[error("pack {id} is {actual} bytes, the manifest says {expected}: refusing a corrupt pack")]
    PackSize {
        id: ContentHash,
        expected: u64,
        actual: usize,
    },
    #[error(
        "{path}: content hash {actual} does not match the manifest's {expected}: refusing corrupt data"
    )]
    Corrupt {
        path: String,
        expected: ContentHash,
        actual: ContentHash,
    },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("deadline of {0:?} passed; the root was left as it was")]
    Deadline(Duration),
    #[error("cancelled at the deadline")]
    Cancelled,
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> InstallError + 'a {
    move |source| InstallError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Installs into `root` within `opts.deadline`. Never panics on input from the store; every
/// failure is a `Failed` report with the reason.
pub fn install(
    store: Arc<dyn Store>,
    layout: &KeyLayout,
    policy: &dyn CachePolicy,
    root: &Path,
    facts: &Facts,
    opts: &InstallOptions,
) -> InstallReport {
    let started = Instant::now();
    let mut report = InstallReport {
        cache_kind: policy.info().cache_kind.clone(),
        root: root.into(),
        outcome: InstallOutcome::Failed,
        detail: String::new(),
        compat_key: None,
        compat_id: None,
        generation: None,
        signer: None,
        refused: vec![],
        damaged: vec![],
        files_in_generation: 0,
        files_installed: 0,
        bytes_installed: 0,
        files_already_present: 0,
        conflicts: vec![],
        packs_fetched: 0,
        bytes_fetched: 0,
        duration_ms: 0,
    };
    let key = match policy.compat_key(facts) {
        Ok(k) => k,
        Err(e) => {
            report.detail = format!(
                "policy {} gave no compatibility key: {e}",
                policy.info().name
            );
            report.duration_ms = started.elapsed().as_millis() as u64;
            return report;
        }
    };
    let compat = CompatId::new(&report.cache_kind, &key);
    report.compat_key = Some(key);
    report.compat_id = Some(compat);

    // The work runs on its own thread so the deadline holds even if a store call blocks; the
    // commit gate makes "timed out" and "moved files into the root" mutually exclusive.
    let gate = Arc::new(CommitGate::default());
    let (tx, rx) = mpsc::channel();
    let job = Job {
        store,
        layout: layout.clone(),
        root: root.to_owned(),
        compat,
        deadline: started + opts.deadline,
        gate: gate.clone(),
        fallback_depth: opts.fallback_depth,
        trust: opts.trust.clone(),
        report: report.clone(),
    };
    std::thread::spawn(move || {
        let mut job = job;
        let result = job.run();
        let _ = tx.send((result, job.report));
    });
    let remaining = opts.deadline.saturating_sub(started.elapsed());
    let (result, mut report) = match rx.recv_timeout(remaining) {
        Ok(r) => r,
        Err(_) => {
            if gate.cancel_unless_committing() {
                let staging = gate
                    .staging
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                if let Some(dir) = staging {
                    let _ = fs::remove_dir_all(dir);
                }
                report.detail = InstallError::Deadline(opts.deadline).to_string();
                report.duration_ms = started.elapsed().as_millis() as u64;
                return report;
            }
            // The job is moving verified files into place; that is quick and must finish.
            rx.recv()
                .unwrap_or_else(|_| (Err(InstallError::Cancelled), report.clone()))
        }
    };
    match result {
        Ok((outcome, detail)) => {
            report.outcome = outcome;
            report.detail = detail;
        }
        Err(e) => {
            report.outcome = InstallOutcome::Failed;
            report.detail = e.to_string();
        }
    }
    report.duration_ms = started.elapsed().as_millis() as u64;
    report
}

#[derive(Default)]
struct CommitGate {
    state: Mutex<GateState>,
    done: Condvar,
    staging: Mutex<Option<PathBuf>>,
}

#[derive(Default, PartialEq, Eq)]
enum GateState {
    #[default]
    Working,
    Committing,
    Cancelled,
}

impl CommitGate {
    /// The job asks to start moving files into the root.
    fn enter_commit(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if *s == GateState::Cancelled {
            return false;
        }
        *s = GateState::Committing;
        true
    }

    fn cancelled(&self) -> bool {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) == GateState::Cancelled
    }

    /// The deadline passed: cancel, unless the job is already committing.
    fn cancel_unless_committing(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if *s == GateState::Committing {
            return false;
        }
        *s = GateState::Cancelled;
        self.done.notify_all();
        true
    }
}

struct Job {
    store: Arc<dyn Store>,
    layout: KeyLayout,
    root: PathBuf,
    compat: CompatId,
    deadline: Instant,
    gate: Arc<CommitGate>,
    fallback_depth: usize,
    trust: Arc<TrustPolicy>,
    report: InstallReport,
}

/// What to write: a file of the manifest and where it goes in staging.
struct Pending<'m> {
    record: &'m FileRecord,
    staged: PathBuf,
}

impl Job {
    fn check_time(&self) -> Result<(), InstallError> {
        if self.gate.cancelled() || Instant::now() >= self.deadline {
            return Err(InstallError::Cancelled);
        }
        Ok(())
    }

    fn run(&mut self) -> Result<(InstallOutcome, String), InstallError> {
        let store = self.store.clone();
        let Some(head) = catalog::newest_head(store.as_ref(), &self.layout, &self.compat)? else {
            return Ok((
                InstallOutcome::Miss,
                format!("no generation published yet for compat id {}", self.compat),
            ));
        };
        let mut heads = vec![head.clone()];
        heads.extend(catalog::older_heads(
            store.as_ref(),
            &self.layout,
            &head,
            self.fallback_depth,
        )?);
        let mut next = 0;
        let mut lock = None;
        loop {
            let Some(manifest) = self.pick_complete(&heads, &mut next)? else {
                return Ok(self.nothing_installable(&head, heads.len()));
            };
            self.report.generation = Some(manifest.id());
            self.report.files_in_generation = manifest.files.len() as u64;
            self.check_time()?;
            let parent = self
                .root
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from("/"));
            if lock.is_none() {
                fs::create_dir_all(&parent).map_err(io("create", &parent))?;
                lock = Some(self.lock(&parent)?);
                self.check_time()?;
            }
            match self.install_generation(&manifest, &parent) {
                // Found in staging, before anything entered the root: an older generation may
                // not need that pack (a poisoned pack is never overwritten by a later put).
                Err(
                    e @ (InstallError::Corrupt { .. }
                    | InstallError::PackSize { .. }
                    | InstallError::PackVanished(_)),
                ) => {
                    tracing::warn!(generation = %manifest.id(), error = %e, "trying an older generation");
                    self.report
                        .damaged
                        .push(format!("generation {}: {e}", manifest.id()));
                    self.report.packs_fetched = 0;
                    self.report.bytes_fetched = 0;
                }
                other => return other,
            }
        }
    }

    /// Installs `manifest` (the lock is held): what is missing on disk, through staging.
    fn install_generation(
        &mut self,
        manifest: &Manifest,
        parent: &Path,
    ) -> Result<(InstallOutcome, String), InstallError> {
        let (todo, conflicts, present) = diff_with_disk(&self.root, manifest)?;
        self.report.conflicts = conflicts;
        self.report.files_already_present = present;
        let mut detail = if todo.is_empty() {
            format!("generation {} already on disk", manifest.id())
        } else {
            let staging = self.staging_dir(parent)?;
            *self.gate.staging.lock().unwrap_or_else(|e| e.into_inner()) = Some(staging.clone());
            let result = self.fetch_and_commit(manifest, &todo, &staging);
            let _ = fs::remove_dir_all(&staging);
            result?;
            format!(
                "installed {} files of generation {}",
                self.report.files_installed,
                manifest.id()
            )
        };
        if let Some(signer) = &self.report.signer {
            detail.push_str(&format!(" ({signer})"));
        }
        if !self.report.refused.is_empty() || !self.report.damaged.is_empty() {
            detail.push_str(&format!(
                "; passed over {} newer head(s): {}",
                self.report.refused.len() + self.report.damaged.len(),
                self.passed_over()
            ));
        }
        let outcome = if todo.is_empty() {
            InstallOutcome::AlreadyCurrent
        } else {
            InstallOutcome::Installed
        };
        Ok((outcome, detail))
    }

    fn passed_over(&self) -> String {
        self.report
            .refused
            .iter()
            .map(|r| format!("seq {} {}", r.seq, r.signer))
            .chain(self.report.damaged.iter().cloned())
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The outcome when no candidate could be installed: `untrusted` if the trust refused every
    /// one, `failed` if one had a corrupt or vanishing pack, else `miss`.
    fn nothing_installable(
        &self,
        head: &crate::generation::HeadRecord,
        candidates: usize,
    ) -> (InstallOutcome, String) {
        if self.report.refused.len() == candidates {
            return (
                InstallOutcome::Untrusted,
                format!(
                    "trust mode {} refused generation {} and the {} older head(s) tried: {}; \
                     publish with a trusted signing key, or add the publisher's public key to \
                     [trust] trusted_keys",
                    self.trust.mode().as_str(),
                    head.generation,
                    candidates - 1,
                    self.passed_over()
                ),
            );
        }
        // A pack that turned out corrupt (or vanished mid-fetch) with nothing older to fall back
        // to is a failure, as before fallbacks existed: the data is there but wrong.
        if !self.report.damaged.is_empty() {
            return (
                InstallOutcome::Failed,
                format!(
                    "no older complete generation to fall back to: {}",
                    self.passed_over()
                ),
            );
        }
        let mut detail = format!(
            "generation {} (and {} older) incomplete in the store: evicted, removed or corrupt",
            head.generation,
            candidates - 1
        );
        if !self.report.refused.is_empty() || !self.report.damaged.is_empty() {
            detail.push_str(&format!(" ({})", self.passed_over()));
        }
        (InstallOutcome::Miss, detail)
    }

    /// The next candidate from `heads[*next..]` whose head the trust admits and whose manifest and
    /// packs are all in the store right now; records refused heads in the report.
    fn pick_complete(
        &mut self,
        heads: &[crate::generation::HeadRecord],
        next: &mut usize,
    ) -> Result<Option<Manifest>, InstallError> {
        let store = self.store.clone();
        let store = store.as_ref();
        while let Some(h) = heads.get(*next) {
            *next += 1;
            self.check_time()?;
            let signer = self.trust.judge(self.layout.namespace(), h);
            if !self
                .trust
                .admits(&signer, &format_args!("generation {}", h.generation))
            {
                tracing::warn!(seq = h.seq, generation = %h.generation, "refused: {signer}");
                self.report.refused.push(RefusedHead {
                    seq: h.seq,
                    generation: h.generation,
                    signer,
                });
                continue;
            }
            match catalog::fetch_manifest(store, &self.layout, &h.generation)? {
                // The signature binds the head to its compat id; the manifest must agree.
                Some(m) if m.compat_id != self.compat => {
                    tracing::warn!(generation = %h.generation, "manifest belongs to compat id {}; skipping it", m.compat_id)
                }
                Some(m) if catalog::packs_present(store, &self.layout, &m)? => {
                    self.report.signer = Some(signer);
                    return Ok(Some(m));
                }
                Some(_) => {
                    tracing::warn!(generation = %h.generation, "generation has evicted packs; trying an older one")
                }
                None => {
                    tracing::warn!(generation = %h.generation, "manifest missing; trying an older generation")
                }
            }
        }
        Ok(None)
    }

    fn lock(&self, parent: &Path) -> Result<File, InstallError> {
        let name = self
            .root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "root".into());
        let path = parent.join(format!(".{name}.jitship.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io("open lock", &path))?;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(file),
                Err(fs::TryLockError::WouldBlock) => {
                    self.check_time()?;
                    std::thread::sleep(Duration::from_millis(25));
                }
                Err(fs::TryLockError::Error(e)) => {
                    return Err(InstallError::Io {
                        op: "lock",
                        path,
                        source: e,
                    });
                }
            }
        }
    }

    /// A fresh staging directory on the root's filesystem; stale ones from crashed installs
    /// (we hold the lock, so nobody else is using them) are removed first.
    fn staging_dir(&self, parent: &Path) -> Result<PathBuf, InstallError> {
        let name = self
            .root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let beside = format!("{STAGING_PREFIX}{name}-");
        remove_stale(parent, &beside);
        remove_stale(&self.root, STAGING_PREFIX);
        let same_fs = match (fs::metadata(parent), fs::metadata(&self.root)) {
            (Ok(p), Ok(r)) => p.dev() == r.dev(),
            _ => true,
        };
        let (dir, prefix) = if same_fs {
            (parent, beside)
        } else {
            (self.root.as_path(), STAGING_PREFIX.to_owned())
        };
        let staging = tempfile::Builder::new()
            .prefix(&prefix)
            .tempdir_in(dir)
            .map_err(io("create staging in", dir))?;
        Ok(staging.keep())
    }

    fn fetch_and_commit(
        &mut self,
        manifest: &Manifest,
        todo: &[&FileRecord],
        staging: &Path,
    ) -> Result<(), InstallError> {
        let tree = staging.join("tree");
        let pending: Vec<Pending> = todo
            .iter()
            .map(|r| Pending {
                record: r,
                staged: r.path.to_path(&tree),
            })
            .collect();
        self.write_staging(manifest, &pending, &tree)?;
        self.check_time()?;
        sync_filesystem(staging);
        if !self.gate.enter_commit() {
            return Err(InstallError::Cancelled);
        }
        // The bytes are durable before any name appears in the root; losing the renames to a
        // crash only loses the install (staging is cleaned by the next one).
        commit(&self.root, &tree, &pending, &mut self.report)
    }

    /// Streams the needed packs (one in flight while the previous one is written) and writes
    /// every file into staging, verifying its blake3 before it counts as written. A file is open
    /// only while a piece of it is written, so the number of descriptors stays constant whatever
    /// the number of files.
    fn write_staging(
        &mut self,
        manifest: &Manifest,
        pending: &[Pending],
        tree: &Path,
    ) -> Result<(), InstallError> {
        let mut writer = StagingWriter::new(tree)?;
        // Which pending files need which pack, in pack order.
        let mut by_pack: BTreeMap<u32, Vec<(usize, u64, u64, u64)>> = BTreeMap::new();
        for (i, p) in pending.iter().enumerate() {
            if p.record.chunks.is_empty() {
                writer.write_whole(p, &[])?;
            }
            let mut file_offset = 0;
            for c in &p.record.chunks {
                by_pack
                    .entry(c.pack)
                    .or_default()
                    .push((i, file_offset, c.offset, c.len));
                file_offset += c.len;
            }
        }

        let packs: Vec<u32> = by_pack.keys().copied().collect();
        let store = self.store.clone();
        let layout = self.layout.clone();
        let ids: Vec<ContentHash> = packs
            .iter()
            .map(|&i| manifest.packs[i as usize].id)
            .collect();
        let (tx, rx) = mpsc::sync_channel::<Result<(usize, Option<Vec<u8>>), StoreError>>(1);
        let gate = self.gate.clone();
        std::thread::spawn(move || {
            for (i, id) in ids.iter().enumerate() {
                if gate.cancelled() {
                    return;
                }
                let r = store.get(&layout.pack(id)).map(|v| (i, v));
                if tx.send(r).is_err() {
                    return;
                }
            }
        });
        for received in rx {
            self.check_time()?;
            let (i, bytes) = received?;
            let pack = &manifest.packs[packs[i] as usize];
            let bytes = bytes.ok_or(InstallError::PackVanished(pack.id))?;
            if bytes.len() as u64 != pack.size {
                return Err(InstallError::PackSize {
                    id: pack.id,
                    expected: pack.size,
                    actual: bytes.len(),
                });
            }
            self.report.packs_fetched += 1;
            self.report.bytes_fetched += bytes.len() as u64;
            for &(fi, file_offset, pack_offset, len) in &by_pack[&packs[i]] {
                let slice = &bytes[pack_offset as usize..(pack_offset + len) as usize];
                if pending[fi].record.chunks.len() == 1 {
                    writer.write_whole(&pending[fi], slice)?;
                } else {
                    writer.write_piece(fi, &pending[fi], file_offset, slice)?;
                }
            }
        }
        if let Some(fi) = writer.unfinished.keys().next() {
            // Cannot happen for a validated manifest whose packs all arrived; refuse rather than trust.
            return Err(InstallError::Corrupt {
                path: pending[*fi].record.path.to_string(),
                expected: pending[*fi].record.blake3,
                actual: ContentHash::of(b""),
            });
        }
        Ok(())
    }
}

/// Writes staged files: a single-piece file (nearly all of them) is checked in memory and written
/// in one go; a file spread over several packs is written piece by piece and checked once the
/// last piece is in.
struct StagingWriter {
    created_dirs: HashSet<PathBuf>,
    unfinished: HashMap<usize, Unfinished>,
}

struct Unfinished {
    hasher: blake3::Hasher,
    hashed: u64,
    written: u64,
    in_order: bool,
}

impl StagingWriter {
    fn new(tree: &Path) -> Result<Self, InstallError> {
        fs::create_dir_all(tree).map_err(io("create", tree))?;
        Ok(Self {
            created_dirs: HashSet::from([tree.to_owned()]),
            unfinished: HashMap::new(),
        })
    }

    fn ensure_parent(&mut self, path: &Path) -> Result<(), InstallError> {
        if let Some(dir) = path.parent()
            && !self.created_dirs.contains(dir)
        {
            fs::create_dir_all(dir).map_err(io("create", dir))?;
            self.created_dirs.insert(dir.to_owned());
        }
        Ok(())
    }

    fn write_whole(&mut self, p: &Pending, bytes: &[u8]) -> Result<(), InstallError> {
        let actual: ContentHash = blake3::hash(bytes).into();
        if actual != p.record.blake3 {
            return Err(InstallError::Corrupt {
                path: p.record.path.to_string(),
                expected: p.record.blake3,
                actual,
            });
        }
        self.ensure_parent(&p.staged)?;
        let mut file = File::create_new(&p.staged).map_err(io("create", &p.staged))?;
        file.write_all(bytes).map_err(io("write", &p.staged))?;
        finish_file(&file, p)
    }

    fn write_piece(
        &mut self,
        fi: usize,
        p: &Pending,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), InstallError> {
        self.ensure_parent(&p.staged)?;
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p.staged)
            .map_err(io("create", &p.staged))?;
        file.write_all_at(bytes, offset)
            .map_err(io("write", &p.staged))?;
        let state = self.unfinished.entry(fi).or_insert_with(|| Unfinished {
            hasher: blake3::Hasher::new(),
            hashed: 0,
            written: 0,
            in_order: true,
        });
        if state.in_order && state.hashed == offset {
            state.hasher.update(bytes);
            state.hashed += bytes.len() as u64;
        } else {
            state.in_order = false;
        }
        state.written += bytes.len() as u64;
        if state.written < p.record.size {
            return Ok(());
        }
        let state = self.unfinished.remove(&fi).expect("present");
        let actual = if state.in_order {
            state.hasher.finalize().into()
        } else {
            hash_file(&p.staged).map_err(io("read", &p.staged))?.0
        };
        if actual != p.record.blake3 {
            return Err(InstallError::Corrupt {
                path: p.record.path.to_string(),
                expected: p.record.blake3,
                actual,
            });
        }
        finish_file(&file, p)
    }
}

/// Gives a verified staged file the manifest's mode and times.
fn finish_file(file: &File, p: &Pending) -> Result<(), InstallError> {
    let mtime = UNIX_EPOCH
        + Duration::new(
            p.record.mtime_s.max(0) as u64,
            p.record.mtime_ns.min(999_999_999),
        );
    file.set_times(FileTimes::new().set_modified(mtime).set_accessed(mtime))
        .map_err(io("set times on", &p.staged))?;
    file.set_permissions(fs::Permissions::from_mode(p.record.mode & 0o777))
        .map_err(io("chmod", &p.staged))
}

/// Files of the manifest missing on disk; paths present with other content (left alone); and how
/// many are present already. A path whose parent on disk is a link or a file is a conflict too:
/// the install never writes through a link.
fn diff_with_disk<'m>(
    root: &Path,
    manifest: &'m Manifest,
) -> Result<(Vec<&'m FileRecord>, Vec<String>, u64), InstallError> {
    let mut todo = Vec::new();
    let mut conflicts = Vec::new();
    let mut present = 0;
    let mut dir_ok: HashMap<String, bool> = HashMap::new();
    for f in &manifest.files {
        let blocked = f.path.ancestors().any(|d| {
            *dir_ok.entry(d.to_owned()).or_insert_with(|| {
                match fs::symlink_metadata(root.join(d)) {
                    Ok(m) => m.is_dir(),
                    Err(_) => true,
                }
            }) == false
        });
        if blocked {
            conflicts.push(format!("{}: a parent on disk is not a directory", f.path));
            continue;
        }
        let dest = f.path.to_path(root);
        match fs::symlink_metadata(&dest) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => todo.push(f),
            Err(e) => {
                return Err(InstallError::Io {
                    op: "stat",
                    path: dest,
                    source: e,
                });
            }
            // Same size and the exact mtime an install sets: the file is ours; skip rehashing it.
            Ok(m)
                if m.is_file()
                    && m.len() == f.size
                    && m.mtime() == f.mtime_s
                    && m.mtime_nsec() == i64::from(f.mtime_ns) =>
            {
                present += 1;
            }
            Ok(m) if m.is_file() && m.len() == f.size => {
                let (h, _) = hash_file(&dest).map_err(io("read", &dest))?;
                if h == f.blake3 {
                    present += 1;
                } else {
                    conflicts.push(format!("{}: present with other content", f.path));
                }
            }
            Ok(_) => conflicts.push(format!("{}: present with another size or type", f.path)),
        }
    }
    Ok((todo, conflicts, present))
}

/// Moves verified files into the root. A root that does not exist yet arrives in one rename;
/// otherwise file by file with RENAME_NOREPLACE (never over a file that appeared meanwhile). On
/// an error, what was moved and created is taken back out, so the root is as it was.
fn commit(
    root: &Path,
    tree: &Path,
    pending: &[Pending],
    report: &mut InstallReport,
) -> Result<(), InstallError> {
    let bytes: u64 = pending.iter().map(|p| p.record.size).sum();
    // A root that does not exist, or exists empty, receives the whole tree in one rename (rename(2)
    // replaces an empty directory). If that fails (a mount point, a file appeared), go file by file.
    let root_is_empty_dir = fs::read_dir(root).is_ok_and(|mut d| d.next().is_none());
    if fs::symlink_metadata(root).is_err() || root_is_empty_dir {
        let old_mode = fs::metadata(root).ok().map(|m| m.permissions());
        match fs::rename(tree, root) {
            Ok(()) => {
                if let Some(mode) = old_mode {
                    fs::set_permissions(root, mode).map_err(io("chmod", root))?;
                }
                report.files_installed = pending.len() as u64;
                report.bytes_installed = bytes;
                return Ok(());
            }
            Err(e) if !root_is_empty_dir => {
                return Err(InstallError::Io {
                    op: "rename into",
                    path: root.into(),
                    source: e,
                });
            }
            Err(_) => {}
        }
    }
    let mut moved: Vec<PathBuf> = Vec::new();
    let mut created_dirs: Vec<PathBuf> = Vec::new();
    let result = (|| {
        for p in pending {
            for d in p.record.path.ancestors() {
                let dir = root.join(d);
                match fs::symlink_metadata(&dir) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        return Err(InstallError::Io {
                            op: "install under",
                            path: dir,
                            source: std::io::Error::other(
                                "not a directory (changed during the install)",
                            ),
                        });
                    }
                    Err(_) => {
                        fs::create_dir(&dir).map_err(io("create", &dir))?;
                        created_dirs.push(dir);
                    }
                }
            }
            let dest = p.record.path.to_path(root);
            match rename_noreplace(&p.staged, &dest) {
                Ok(()) => {
                    moved.push(dest);
                    report.files_installed += 1;
                    report.bytes_installed += p.record.size;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    report.conflicts.push(format!(
                        "{}: appeared during the install (left alone)",
                        p.record.path
                    ));
                }
                Err(e) => {
                    return Err(InstallError::Io {
                        op: "rename into",
                        path: dest,
                        source: e,
                    });
                }
            }
        }
        Ok(())
    })();
    if result.is_err() {
        for f in moved.iter().rev() {
            let _ = fs::remove_file(f);
        }
        for d in created_dirs.iter().rev() {
            let _ = fs::remove_dir(d);
        }
        report.files_installed = 0;
        report.bytes_installed = 0;
    }
    result
}

fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let from_c = CString::new(from.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let to_c = CString::new(to.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // std has no no-replace rename; renameat2(2) is the one atomic way to get it on Linux.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from_c.as_ptr(),
            libc::AT_FDCWD,
            to_c.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Flushes the filesystem holding `path` so renamed files are never seen empty after a crash.
fn sync_filesystem(path: &Path) {
    if let Ok(f) = File::open(path) {
        use std::os::fd::AsRawFd;
        // One syncfs is far cheaper than an fsync per small file.
        unsafe { libc::syncfs(f.as_raw_fd()) };
    }
}

fn remove_stale(dir: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(prefix) {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}
