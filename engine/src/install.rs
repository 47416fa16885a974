//! Installing the newest generation for this worker into a cache root.
//!
//! head -> manifest (validated: relative, normalized paths; regular files only; the compat id and
//! kind it was found under) -> diff with disk -> fetch the packs holding missing files -> write
//! them into a staging directory while hashing -> verify every file's blake3 -> move into place,
//! markers last. Invariant 2: nothing unverified ever enters the root, nothing outside it is ever
//! created, changed or removed, and a failed or timed-out install leaves the root as it was.
//!
//! Every operation inside the root and inside staging goes through `confined`: one descriptor of
//! each, opened once, and no link followed below it (`openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)`), so swapping a directory of the root for a link while an install runs
//! cannot redirect a write or a removal. The root's own path is the operator's: a root that is
//! itself a symlink is resolved once, at the start (logged), and everything after goes through
//! the descriptor of what it pointed to then.
//!
//! Staging lives beside the root (same filesystem, so the final moves are renames) or, when the root
//! is a mount point of its own, in a `.jitship-staging-*` directory inside it that scans ignore.
//! A file lock beside the root serializes installers on one pod (invariant 5); the second one waits,
//! then finds the files present and reports already-current.
//!
//! The commit moves non-marker files first, then the files the policy marks as markers (those the
//! engine finds the others through), so an engine never sees a marker before what it marks. A
//! SIGKILL during the commit (nothing can catch it) leaves some of the new files in the root, each
//! complete and verified, and markers only once all the files they mark are in; the staging
//! directory stays behind. The next install removes that staging and moves in what is missing.
//!
//! Fallbacks: the newest head and up to `fallback_depth` older ones are candidates, newest first.
//! A candidate is skipped when the trust refuses its head (`crate::trust`; under `required` an
//! unsigned, untrusted or forged head), when its manifest or a pack is missing (evicted), and when
//! a pack turns out corrupt or vanishes while it is fetched (checked in staging, before anything
//! enters the root). The newest candidate left is installed; if every candidate was refused by
//! the trust the outcome is `untrusted`.
//!
//! Files stored in their root-independent form (`FileRecord::canonical`, e.g. Triton group files)
//! are verified as stored, then materialized for this root by the policy before they are written
//! to staging (`Materializer`); "already on disk" compares such a file by canonicalizing the copy
//! on disk.
//!
//! Once the generation is in place (installed, already current, or partly, beside conflicts), the
//! install leaves a record of it beside the root (`record`: `.<name>.jitship-installed.json`,
//! written through the parent's descriptor) for `jitship audit`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File, FileTimes};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, Instant, UNIX_EPOCH};

use rayon::prelude::*;
use serde::Serialize;

use crate::catalog::KeyLayout;
use crate::catalog::{self, CatalogError};
use crate::facts::Facts;
use crate::generation::{
    CompatId, ContentHash, FileRecord, GenerationId, Manifest, hash_open_file,
};
use crate::policy::{CachePolicy, PolicyError};
use crate::scan::STAGING_PREFIX;
use crate::store::{Fetched, Store, StoreError, StoreResult};
use crate::trust::{Signer, TrustPolicy};

pub mod confined;
pub mod record;
use confined::{Confined, Kind};

#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// Bound on the whole install, lock wait included.
    pub deadline: Duration,
    /// How many older heads to try when the newest generation is unusable: packs evicted from the
    /// store, or recorded as an incomplete cache by its policy (a complete one is preferred).
    pub fallback_depth: usize,
    /// Test hook (hidden flag `--test-commit-pause`): a pause before each file moved into the
    /// root, so a test can SIGKILL the real binary mid-commit. Zero otherwise.
    pub commit_pause: Duration,
    /// Which heads may be installed.
    pub trust: Arc<TrustPolicy>,
}

impl Default for InstallOptions {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(60),
            fallback_depth: 3,
            commit_pause: Duration::ZERO,
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
    /// Files of the generation are present with other content (left alone): the generation is
    /// only partly installed.
    Conflict,
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
            Self::Conflict => 13,
            Self::Untrusted => 14,
        }
    }

    /// Severity order used to summarize several caches in one exit code.
    pub fn severity(self) -> u8 {
        match self {
            Self::AlreadyCurrent => 0,
            Self::Installed => 1,
            Self::Miss => 2,
            Self::Conflict => 3,
            Self::Untrusted => 4,
            Self::Failed => 5,
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
    /// Whether the generation taken is a complete cache for its kind (its policy said so when it
    /// was published); `None` when none was taken.
    pub complete: Option<bool>,
    /// Why it is not complete (the policy's words at publish).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// Newer generations passed over because they were incomplete caches.
    pub newer_incomplete: Vec<GenerationId>,
    pub files_in_generation: u64,
    pub files_installed: u64,
    pub bytes_installed: u64,
    pub files_already_present: u64,
    /// Files written in the form the policy materialized for this root (they embed the root).
    pub files_materialized: Vec<String>,
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

impl InstallReport {
    /// A `failed` report with nothing done: the starting point of every install, and the report
    /// of a cache that could not be started (store unreachable, no policy engine).
    pub fn failed(cache_kind: &str, root: &Path, detail: String) -> Self {
        Self {
            cache_kind: cache_kind.to_owned(),
            root: root.to_owned(),
            outcome: InstallOutcome::Failed,
            detail,
            compat_key: None,
            compat_id: None,
            generation: None,
            signer: None,
            refused: vec![],
            damaged: vec![],
            complete: None,
            incomplete: None,
            newer_incomplete: vec![],
            files_in_generation: 0,
            files_installed: 0,
            bytes_installed: 0,
            files_already_present: 0,
            files_materialized: vec![],
            conflicts: vec![],
            packs_fetched: 0,
            bytes_fetched: 0,
            duration_ms: 0,
        }
    }
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
    #[error(
        "{path}: the policy could not write this file for this root ({source}); the root was left as it was"
    )]
    Materialize { path: String, source: PolicyError },
    #[error("deadline of {0:?} passed; the root was left as it was")]
    Deadline(Duration),
    #[error("cancelled at the deadline")]
    Cancelled,
    #[error(
        "head for compat id {head} ({kind}) points at generation {generation} of compat id \
         {manifest_compat} ({manifest_kind}): refusing a generation of another cache"
    )]
    CrossCompat {
        head: CompatId,
        kind: String,
        generation: GenerationId,
        manifest_compat: CompatId,
        manifest_kind: String,
    },
    #[error("{0}: the cache root must be a directory (or not exist yet)")]
    RootNotDir(PathBuf),
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
    policy: Arc<dyn CachePolicy>,
    root: &Path,
    facts: &Facts,
    opts: &InstallOptions,
) -> InstallReport {
    let started = Instant::now();
    let mut report = InstallReport::failed(&policy.info().cache_kind, root, String::new());
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
        materializer: Materializer {
            policy,
            root: root.to_owned(),
        },
        compat,
        deadline: started + opts.deadline,
        gate: gate.clone(),
        fallback_depth: opts.fallback_depth,
        commit_pause: opts.commit_pause,
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
                // The job may still be writing (a store call can block); it writes only through
                // the staging descriptor, so once the directory is unlinked it cannot add to it.
                let staging = gate
                    .staging
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                if let Some(dir) = staging {
                    remove_staging(&dir);
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
    materializer: Materializer,
    compat: CompatId,
    deadline: Instant,
    gate: Arc<CommitGate>,
    fallback_depth: usize,
    commit_pause: Duration,
    trust: Arc<TrustPolicy>,
    report: InstallReport,
}

/// What to write: a file of the manifest and where it goes in staging (relative to the staging
/// directory's descriptor).
struct Pending<'m> {
    record: &'m FileRecord,
    staged: String,
}

/// The root, resolved once at the start of an install.
struct Target {
    /// The directory holding the root, open (its path is the operator's, made canonical).
    parent: Confined,
    /// The root's name in `parent`.
    name: String,
    /// The root, open; `None` if it does not exist yet.
    dir: Option<Confined>,
}

impl Target {
    fn path(&self) -> PathBuf {
        self.parent.path().join(&self.name)
    }
}

/// Resolves the configured root once: a root that is a symlink is followed now (and logged) and
/// never again; the parent directory is created if missing. Everything after this goes through
/// the descriptors opened here.
fn resolve_root(configured: &Path) -> Result<Target, InstallError> {
    let absolute = std::path::absolute(configured).map_err(io("resolve", configured))?;
    let resolved = match fs::symlink_metadata(&absolute) {
        Ok(m) if m.file_type().is_symlink() => {
            let target = fs::canonicalize(&absolute)
                .map_err(io("resolve the symlink (its target must exist)", &absolute))?;
            tracing::info!(
                root = %absolute.display(),
                target = %target.display(),
                "the cache root is a symlink: installing into its target, resolved once now"
            );
            target
        }
        _ => absolute,
    };
    let (Some(parent), Some(name)) = (
        resolved.parent(),
        resolved.file_name().and_then(|n| n.to_str()),
    ) else {
        return Err(InstallError::RootNotDir(resolved));
    };
    fs::create_dir_all(parent).map_err(io("create", parent))?;
    let parent_path = fs::canonicalize(parent).map_err(io("resolve", parent))?;
    let parent = Confined::open(&parent_path).map_err(io("open", &parent_path))?;
    let dir = match parent.open_dir(name) {
        Ok(d) => Some(d),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR) | Some(libc::ELOOP)) => {
            return Err(InstallError::RootNotDir(parent_path.join(name)));
        }
        Err(e) => {
            return Err(InstallError::Io {
                op: "open",
                path: parent_path.join(name),
                source: e,
            });
        }
    };
    Ok(Target {
        parent,
        name: name.to_owned(),
        dir,
    })
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
        // The lock (taken once, before the root is opened: a concurrent installer may be renaming
        // a whole tree into place) and where the root lives.
        let mut locked: Option<(File, PathBuf, String)> = None;
        loop {
            let Some(manifest) = self.pick_complete(&heads, &mut next)? else {
                return Ok(self.nothing_installable(&head, heads.len()));
            };
            self.report.generation = Some(manifest.id());
            self.report.complete = Some(manifest.incomplete.is_none());
            self.report.incomplete = manifest.incomplete.clone();
            self.report.files_in_generation = manifest.files.len() as u64;
            self.check_time()?;
            if locked.is_none() {
                let (parent_path, name) = {
                    let t = resolve_root(&self.root)?;
                    (t.parent.path().to_owned(), t.name)
                };
                let lock = self.lock(&parent_path, &name)?;
                locked = Some((lock, parent_path, name));
                self.check_time()?;
            }
            let (_, parent_path, name) = locked.as_ref().expect("locked above");
            let target = resolve_root(&parent_path.join(name))?;
            match self.install_generation(&manifest, &target) {
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
                    self.report.files_materialized.clear();
                }
                other => return other,
            }
        }
    }

    /// Installs `manifest` (the lock is held): what is missing on disk, through staging.
    fn install_generation(
        &mut self,
        manifest: &Manifest,
        target: &Target,
    ) -> Result<(InstallOutcome, String), InstallError> {
        let (todo, conflicts, present) =
            diff_with_disk(target.dir.as_ref(), manifest, &self.materializer)?;
        self.report.conflicts = conflicts;
        self.report.files_already_present = present;
        if !todo.is_empty() {
            let (staging_path, staging) = self.staging_dir(target)?;
            *self.gate.staging.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(staging_path.clone());
            let result = self.fetch_and_commit(manifest, &todo, &staging, target);
            drop(staging);
            remove_staging(&staging_path);
            result?;
        }
        self.record(manifest, target);
        let (outcome, mut detail) = self.outcome(manifest);
        match &manifest.incomplete {
            None if self.report.newer_incomplete.is_empty() => {}
            None => detail.push_str(&format!(
                " (the newest complete cache; {} newer generation(s) are incomplete)",
                self.report.newer_incomplete.len()
            )),
            Some(why) => detail.push_str(&format!(
                " (an INCOMPLETE cache: {why}; no complete generation among the newest {})",
                self.fallback_depth + 1
            )),
        }
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
        Ok((outcome, detail))
    }

    /// What the install achieved: conflicts mean the generation is not fully on disk, whatever
    /// else was moved in.
    fn outcome(&self, manifest: &Manifest) -> (InstallOutcome, String) {
        let id = manifest.id();
        let n = self.report.files_installed;
        if !self.report.conflicts.is_empty() {
            (
                InstallOutcome::Conflict,
                format!(
                    "generation {id} is only partly installed: {} of its {} files are on disk with \
                     other content or blocked (left alone); {n} installed now",
                    self.report.conflicts.len(),
                    manifest.files.len()
                ),
            )
        } else if n == 0 {
            (
                InstallOutcome::AlreadyCurrent,
                format!("generation {id} already on disk"),
            )
        } else {
            (
                InstallOutcome::Installed,
                format!("installed {n} files of generation {id}"),
            )
        }
    }

    /// Leaves the record `jitship audit` compares the root with later (`record`), beside
    /// the root, through the descriptor of its parent the commit renames through (the lock is
    /// held): never following a link, and scans never offer it. It holds what this install put (or found) in
    /// place: every file of the generation but the conflicts left alone, with its size on disk (a
    /// file materialized for this root has its own). Best effort: the files are installed whether
    /// or not the record can be written.
    fn record(&self, manifest: &Manifest, target: &Target) {
        let mut record = record::InstallRecord::of(&self.report.cache_kind, manifest);
        for c in &self.report.conflicts {
            record.files.remove(c);
        }
        if manifest.files.iter().any(|f| f.canonical)
            && let Ok(dir) = target.parent.open_dir(&target.name)
        {
            for f in manifest.files.iter().filter(|f| f.canonical) {
                let path = f.path.to_string();
                if let (Some(size), Ok(Some(e))) = (record.files.get_mut(&path), dir.entry(&path))
                    && e.kind == Kind::File
                {
                    *size = e.size;
                }
            }
        }
        if let Err(e) = record::write_record_in(&target.parent, &target.name, &record) {
            tracing::warn!(root = %target.path().display(), "cannot write the install record: {e}");
        }
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
        // The newest usable generation its policy recorded as incomplete, taken only when no
        // complete one follows it: (manifest, signer, index after it).
        let mut newest_incomplete: Option<(Manifest, Signer, usize)> = None;
        let mut passed_over = Vec::new();
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
                Some(m) if m.compat_id != self.compat || m.cache_kind != self.report.cache_kind => {
                    return Err(InstallError::CrossCompat {
                        head: self.compat,
                        kind: self.report.cache_kind.clone(),
                        generation: h.generation,
                        manifest_compat: m.compat_id,
                        manifest_kind: m.cache_kind,
                    });
                }
                Some(m) if catalog::packs_present(store, &self.layout, &m)? => {
                    if m.incomplete.is_none() {
                        self.report.signer = Some(signer);
                        self.report.newer_incomplete = passed_over;
                        return Ok(Some(m));
                    }
                    tracing::info!(generation = %h.generation, "generation is an incomplete cache; looking for an older complete one");
                    passed_over.push(m.id());
                    if newest_incomplete.is_none() {
                        newest_incomplete = Some((m, signer, *next));
                    }
                }
                Some(_) => {
                    tracing::warn!(generation = %h.generation, "generation has evicted packs; trying an older one")
                }
                None => {
                    tracing::warn!(generation = %h.generation, "manifest missing; trying an older generation")
                }
            }
        }
        // No complete one: the newest incomplete one, which the report marks as such. Should its
        // packs turn out damaged, the caller's next try starts after it.
        let Some((m, signer, after)) = newest_incomplete else {
            return Ok(None);
        };
        let id = m.id();
        passed_over.retain(|g| *g != id);
        self.report.newer_incomplete = passed_over;
        self.report.signer = Some(signer);
        *next = after;
        Ok(Some(m))
    }

    fn lock(&self, parent: &Path, name: &str) -> Result<File, InstallError> {
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

    /// A fresh staging directory on the root's filesystem, open; stale ones from crashed installs
    /// (we hold the lock, so nobody else is using them) are removed first.
    fn staging_dir(&self, target: &Target) -> Result<(PathBuf, Confined), InstallError> {
        let parent = target.parent.path();
        let root = target.path();
        let beside = format!("{STAGING_PREFIX}{}-", target.name);
        remove_stale(parent, &beside);
        let same_fs = match &target.dir {
            Some(dir) => {
                let (root_dev, _, _) = dir.stat().map_err(io("stat", &root))?;
                let (parent_dev, _, _) = target.parent.stat().map_err(io("stat", parent))?;
                root_dev == parent_dev
            }
            None => true,
        };
        let (dir, prefix) = if same_fs {
            (parent.to_owned(), beside)
        } else {
            remove_stale(&root, STAGING_PREFIX);
            (root, STAGING_PREFIX.to_owned())
        };
        let staging = tempfile::Builder::new()
            .prefix(&prefix)
            .tempdir_in(&dir)
            .map_err(io("create staging in", &dir))?
            .keep();
        let opened = Confined::open(&staging).map_err(io("open", &staging));
        match opened {
            Ok(c) => Ok((staging, c)),
            Err(e) => {
                remove_staging(&staging);
                Err(e)
            }
        }
    }

    fn fetch_and_commit(
        &mut self,
        manifest: &Manifest,
        todo: &[&FileRecord],
        staging: &Confined,
        target: &Target,
    ) -> Result<(), InstallError> {
        let pending: Vec<Pending> = todo
            .iter()
            .map(|r| Pending {
                record: r,
                staged: format!("{STAGED_TREE}/{}", r.path),
            })
            .collect();
        self.write_staging(manifest, &pending, staging)?;
        self.check_time()?;
        // The bytes are durable before any name appears in the root; losing the renames to a
        // crash only loses the install (staging is cleaned by the next one).
        staging
            .sync_filesystem()
            .map_err(io("flush the file system of", staging.path()))?;
        if !self.gate.enter_commit() {
            return Err(InstallError::Cancelled);
        }
        commit(
            target,
            staging,
            &pending,
            self.commit_pause,
            &mut self.report,
        )
    }

    /// Streams the needed packs and writes every file into staging, verifying its blake3 before
    /// it counts as written. Packs are fetched in batches of at most the largest pack's bytes
    /// (one `get_sized_batch` each) while the previous batch is written, so
    /// fetching overlaps hashing and writing and at most two batches are held at once; the files
    /// of a pack are written in parallel. A file is open only while a piece of it is written, so
    /// the number of descriptors stays bounded whatever the number of files.
    fn write_staging(
        &mut self,
        manifest: &Manifest,
        pending: &[Pending],
        staging: &Confined,
    ) -> Result<(), InstallError> {
        let mut writer = StagingWriter::new(staging, &self.materializer)?;
        // Which pending files need which pack, in pack order.
        let mut by_pack: BTreeMap<u32, Vec<PackPiece>> = BTreeMap::new();
        for (i, p) in pending.iter().enumerate() {
            if p.record.chunks.is_empty() {
                writer.write_whole(p, &[])?;
            }
            let mut file_offset = 0;
            for c in &p.record.chunks {
                by_pack.entry(c.pack).or_default().push(PackPiece {
                    file: i,
                    file_offset,
                    pack_offset: c.offset,
                    len: c.len,
                });
                file_offset += c.len;
            }
        }

        let packs: Vec<u32> = by_pack.keys().copied().collect();
        let store = self.store.clone();
        let layout = self.layout.clone();
        // A batch holds at most the bytes of the largest pack: small packs (a tree's tail, a
        // small tree) share one call, and memory stays at two packs' worth, as with one pack in
        // flight.
        let largest = packs
            .iter()
            .map(|&i| manifest.packs[i as usize].size)
            .max()
            .unwrap_or(0);
        let batches = fetch_batches(
            packs.iter().map(|&i| {
                let p = &manifest.packs[i as usize];
                (p.id, p.size)
            }),
            largest.min(store.max_value_size()),
        );
        // A rendezvous channel: the fetcher hands a batch over only when the writer takes it, so
        // one batch is written while the next is fetched, never more.
        let (tx, rx) = mpsc::sync_channel::<Vec<(usize, StoreResult<Option<Fetched>>)>>(0);
        let gate = self.gate.clone();
        std::thread::spawn(move || {
            for batch in batches {
                if gate.cancelled() {
                    return;
                }
                let keys: Vec<(String, u64)> = batch
                    .iter()
                    .map(|(_, id, size)| (layout.pack(id), *size))
                    .collect();
                let items: Vec<(&str, u64)> = keys.iter().map(|(k, n)| (k.as_str(), *n)).collect();
                let fetched = store.get_sized_batch(&items);
                let batch = batch.iter().map(|&(i, _, _)| i).zip(fetched).collect();
                if tx.send(batch).is_err() {
                    return;
                }
            }
        });
        for batch in rx {
            for (i, received) in batch {
                self.check_time()?;
                let pack = &manifest.packs[packs[i] as usize];
                let bytes = received?.ok_or(InstallError::PackVanished(pack.id))?;
                if bytes.len() as u64 != pack.size {
                    return Err(InstallError::PackSize {
                        id: pack.id,
                        expected: pack.size,
                        actual: bytes.len(),
                    });
                }
                self.report.packs_fetched += 1;
                self.report.bytes_fetched += bytes.len() as u64;
                writer.write_pack(pending, &by_pack[&packs[i]], &bytes)?;
            }
        }
        self.report.files_materialized = std::mem::take(&mut writer.materialized);
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

/// Splits packs `(id, size)` (numbered in the order given) into consecutive batches of at most
/// `budget` bytes each (a larger pack is a batch of its own).
fn fetch_batches(
    packs: impl Iterator<Item = (ContentHash, u64)>,
    budget: u64,
) -> Vec<Vec<(usize, ContentHash, u64)>> {
    let mut batches: Vec<Vec<(usize, ContentHash, u64)>> = Vec::new();
    let mut bytes = 0;
    for (i, (id, size)) in packs.enumerate() {
        match batches.last_mut() {
            Some(last) if bytes + size <= budget => last.push((i, id, size)),
            _ => {
                batches.push(vec![(i, id, size)]);
                bytes = 0;
            }
        }
        bytes += size;
    }
    batches
}

/// Where a piece of a pending file lies in a pack.
struct PackPiece {
    /// Index into the pending files.
    file: usize,
    file_offset: u64,
    pack_offset: u64,
    len: u64,
}

/// The directory inside staging that holds the files, laid out as in the root (so a root that
/// does not exist yet receives it in one rename).
const STAGED_TREE: &str = "tree";

/// Largest file on disk compared in canonical form (files that embed the root are small metadata,
/// as at publish); a larger one at such a path is not the installed file.
const CANONICAL_COMPARE_LIMIT: u64 = 16 << 20;

/// Turns the root-independent form of a file that embeds the root back into the file for this
/// root (`CachePolicy::materialize`), and the other way for comparing a copy on disk. `root` is
/// the root as configured (the path the engine names its files by), as at publish.
struct Materializer {
    policy: Arc<dyn CachePolicy>,
    root: PathBuf,
}

impl Materializer {
    /// The bytes to write for `record` given its verified stored bytes.
    fn for_root<'b>(
        &self,
        record: &FileRecord,
        verified: &'b [u8],
    ) -> Result<std::borrow::Cow<'b, [u8]>, InstallError> {
        if !record.canonical {
            return Ok(verified.into());
        }
        self.policy
            .materialize(&self.root, &record.path, verified)
            .map(Into::into)
            .map_err(|source| InstallError::Materialize {
                path: record.path.to_string(),
                source,
            })
    }

    /// Whether `file` (the copy on disk of `record`, read through the root's descriptor) is
    /// `record` as materialized for this root: its canonical form hashes to the record's (a file
    /// the policy cannot canonicalize, e.g. one naming another root, is not).
    fn on_disk_matches(
        &self,
        record: &FileRecord,
        mut file: File,
        shown: &Path,
    ) -> Result<bool, InstallError> {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut bytes).map_err(io("read", shown))?;
        Ok(self
            .policy
            .canonicalize(&self.root, &record.path, &bytes)
            .is_ok_and(|c| ContentHash::of(&c) == record.blake3))
    }
}

/// Writes staged files: a single-piece file (nearly all of them) is checked in memory and written
/// in one go; a file spread over several packs is written piece by piece and checked once the
/// last piece is in. Everything goes through the staging directory's descriptor. A file stored
/// canonical is verified as stored, then written as materialized for this root.
struct StagingWriter<'s> {
    staging: &'s Confined,
    created_dirs: HashSet<String>,
    unfinished: HashMap<usize, Unfinished>,
    materializer: &'s Materializer,
    materialized: Vec<String>,
}

struct Unfinished {
    hasher: blake3::Hasher,
    hashed: u64,
    written: u64,
    in_order: bool,
}

impl<'s> StagingWriter<'s> {
    fn new(staging: &'s Confined, materializer: &'s Materializer) -> Result<Self, InstallError> {
        staging
            .mkdir(STAGED_TREE, 0o777)
            .map_err(io("create", &staging.display(STAGED_TREE)))?;
        Ok(Self {
            staging,
            created_dirs: HashSet::from([STAGED_TREE.to_owned()]),
            unfinished: HashMap::new(),
            materializer,
            materialized: Vec::new(),
        })
    }

    fn ensure_parent(&mut self, staged: &str) -> Result<(), InstallError> {
        match staged.rsplit_once('/') {
            Some((dir, _)) => self.ensure_dir(dir),
            None => Ok(()),
        }
    }

    /// Creates `dir` and its missing parents, one `mkdirat` each: staging is this install's own
    /// fresh directory, so a directory not yet created here does not exist (and if something
    /// else put one there, the install fails rather than write into it).
    fn ensure_dir(&mut self, dir: &str) -> Result<(), InstallError> {
        if self.created_dirs.contains(dir) {
            return Ok(());
        }
        if let Some((parent, _)) = dir.rsplit_once('/') {
            self.ensure_dir(parent)?;
        }
        self.staging
            .mkdir(dir, 0o777)
            .map_err(io("create", &self.staging.display(dir)))?;
        self.created_dirs.insert(dir.to_owned());
        Ok(())
    }

    /// Writes the pieces a pack holds: the parents first (created once), then the files held
    /// whole by this pack in parallel (hash, create, write: per-file system calls dominate a tree
    /// of small files), then the pieces of files split over packs, in order.
    fn write_pack(
        &mut self,
        pending: &[Pending],
        pieces: &[PackPiece],
        pack: &[u8],
    ) -> Result<(), InstallError> {
        for piece in pieces {
            self.ensure_parent(&pending[piece.file].staged)?;
        }
        let bytes_of = |piece: &PackPiece| {
            &pack[piece.pack_offset as usize..(piece.pack_offset + piece.len) as usize]
        };
        let (whole, split): (Vec<&PackPiece>, Vec<&PackPiece>) = pieces
            .iter()
            .partition(|piece| pending[piece.file].record.chunks.len() == 1);
        let this = &*self;
        let materialized = whole
            .par_iter()
            .with_min_len(8)
            .map(|piece| this.stage_whole(&pending[piece.file], bytes_of(piece)))
            .collect::<Result<Vec<bool>, InstallError>>()?;
        for (piece, materialized) in whole.iter().zip(materialized) {
            if materialized {
                let path = pending[piece.file].record.path.to_string();
                self.materialized.push(path);
            }
        }
        for piece in split {
            let p = &pending[piece.file];
            self.write_piece(piece.file, p, piece.file_offset, bytes_of(piece))?;
        }
        Ok(())
    }

    /// Writes a file held whole in `bytes` (checked against its blake3 first).
    fn write_whole(&mut self, p: &Pending, bytes: &[u8]) -> Result<(), InstallError> {
        self.ensure_parent(&p.staged)?;
        if self.stage_whole(p, bytes)? {
            self.materialized.push(p.record.path.to_string());
        }
        Ok(())
    }

    /// Verifies and stages one whole file whose parent exists; true if it was materialized for
    /// this root.
    fn stage_whole(&self, p: &Pending, bytes: &[u8]) -> Result<bool, InstallError> {
        let actual: ContentHash = blake3::hash(bytes).into();
        if actual != p.record.blake3 {
            return Err(InstallError::Corrupt {
                path: p.record.path.to_string(),
                expected: p.record.blake3,
                actual,
            });
        }
        self.stage_verified(p, bytes)?;
        Ok(p.record.canonical)
    }

    fn write_piece(
        &mut self,
        fi: usize,
        p: &Pending,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), InstallError> {
        self.ensure_parent(&p.staged)?;
        let shown = self.staging.display(&p.staged);
        let file = self
            .staging
            .open_write(&p.staged, 0o600)
            .map_err(io("create", &shown))?;
        file.write_all_at(bytes, offset)
            .map_err(io("write", &shown))?;
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
            let mut f = self
                .staging
                .open_read(&p.staged)
                .map_err(io("read", &shown))?;
            hash_open_file(&mut f).map_err(io("read", &shown))?.0
        };
        if actual != p.record.blake3 {
            return Err(InstallError::Corrupt {
                path: p.record.path.to_string(),
                expected: p.record.blake3,
                actual,
            });
        }
        if p.record.canonical {
            // Verified as stored; now the same file rewritten for this root.
            drop(file);
            let mut verified = Vec::new();
            let mut f = self
                .staging
                .open_read(&p.staged)
                .map_err(io("read", &shown))?;
            std::io::Read::read_to_end(&mut f, &mut verified).map_err(io("read", &shown))?;
            drop(f);
            self.staging
                .remove_file(&p.staged)
                .map_err(io("remove", &shown))?;
            self.stage_verified(p, &verified)?;
            self.materialized.push(p.record.path.to_string());
            return Ok(());
        }
        finish_file(&file, p, &shown)
    }

    /// Writes a verified file into staging: the point where a stored file becomes the file for
    /// this root.
    fn stage_verified(&self, p: &Pending, verified: &[u8]) -> Result<(), InstallError> {
        let bytes = self.materializer.for_root(p.record, verified)?;
        let shown = self.staging.display(&p.staged);
        // Created with its final mode when the umask leaves that mode alone (the usual case),
        // which saves an fchmod per file; staging is private until the commit anyway.
        let mode = p.record.mode & 0o777;
        let exact = umask().is_some_and(|umask| mode & umask == 0);
        let mut file = self
            .staging
            .create_new(&p.staged, if exact { mode } else { 0o600 })
            .map_err(io("create", &shown))?;
        file.write_all(&bytes).map_err(io("write", &shown))?;
        set_times(&file, p, &shown)?;
        if exact {
            return Ok(());
        }
        set_mode(&file, p, &shown)
    }
}

/// Gives a verified staged file the manifest's mode and times.
fn finish_file(file: &File, p: &Pending, shown: &Path) -> Result<(), InstallError> {
    set_times(file, p, shown)?;
    set_mode(file, p, shown)
}

fn set_times(file: &File, p: &Pending, shown: &Path) -> Result<(), InstallError> {
    let mtime = UNIX_EPOCH
        + Duration::new(
            p.record.mtime_s.max(0) as u64,
            p.record.mtime_ns.min(999_999_999),
        );
    file.set_times(FileTimes::new().set_modified(mtime).set_accessed(mtime))
        .map_err(io("set times on", shown))
}

fn set_mode(file: &File, p: &Pending, shown: &Path) -> Result<(), InstallError> {
    file.set_permissions(fs::Permissions::from_mode(p.record.mode & 0o777))
        .map_err(io("chmod", shown))
}

/// The process's umask, read once from `/proc/self/status` (`umask(2)` can only be read by
/// setting it, which races with other threads creating files); `None` where it cannot be read.
fn umask() -> Option<u32> {
    static UMASK: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        let status = fs::read_to_string("/proc/self/status").ok()?;
        let value = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
        u32::from_str_radix(value.trim(), 8).ok()
    })
}

/// Files of the manifest missing on disk; paths present with other content (left alone); and how
/// many are present already. A path whose parent on disk is a link or a file is a conflict too:
/// the install never writes through a link. A root that does not exist yet needs every file.
fn diff_with_disk<'m>(
    root: Option<&Confined>,
    manifest: &'m Manifest,
    materializer: &Materializer,
) -> Result<(Vec<&'m FileRecord>, Vec<String>, u64), InstallError> {
    let Some(root) = root else {
        return Ok((manifest.files.iter().collect(), vec![], 0));
    };
    let mut todo = Vec::new();
    let mut conflicts = Vec::new();
    let mut present = 0;
    let mut dir_ok: HashMap<&str, bool> = HashMap::new();
    for f in &manifest.files {
        // Top down, so a link or file in a parent is seen before anything below it is looked up.
        let blocked = f.path.ancestors().any(|d| {
            !*dir_ok.entry(d).or_insert_with(|| match root.entry(d) {
                Ok(Some(e)) => e.kind == Kind::Dir,
                Ok(None) => true,
                Err(_) => false,
            })
        });
        if blocked {
            conflicts.push(format!("{}: a parent on disk is not a directory", f.path));
            continue;
        }
        let rel = f.path.as_str();
        let shown = || root.display(rel);
        match root.entry(rel).map_err(io("stat", &shown()))? {
            None => todo.push(f),
            // Stored canonical: the size differs from the file's; compare in canonical form.
            Some(e) if e.kind == Kind::File && f.canonical => {
                let matches = e.size <= CANONICAL_COMPARE_LIMIT && {
                    let file = root.open_read(rel).map_err(io("read", &shown()))?;
                    materializer.on_disk_matches(f, file, &shown())?
                };
                if matches {
                    present += 1;
                } else {
                    conflicts.push(format!("{}: present with other content", f.path));
                }
            }
            // Same size and the exact mtime an install sets: the file is ours; skip rehashing it.
            Some(e)
                if e.kind == Kind::File
                    && e.size == f.size
                    && e.mtime_s == f.mtime_s
                    && e.mtime_ns == i64::from(f.mtime_ns) =>
            {
                present += 1;
            }
            Some(e) if e.kind == Kind::File && e.size == f.size => {
                let mut file = root.open_read(rel).map_err(io("read", &shown()))?;
                let (h, _) = hash_open_file(&mut file).map_err(io("read", &shown()))?;
                if h == f.blake3 {
                    present += 1;
                } else {
                    conflicts.push(format!("{}: present with other content", f.path));
                }
            }
            Some(_) => conflicts.push(format!("{}: present with another size or type", f.path)),
        }
    }
    Ok((todo, conflicts, present))
}

/// Moves verified files into the root: non-marker files first, then markers, so the engine never
/// finds a marker before what it marks. A root that does not exist yet, or is an empty directory,
/// receives the whole tree in one rename; otherwise file by file with RENAME_NOREPLACE (never over
/// a file that appeared meanwhile), each through a descriptor of its directory reached beneath the
/// root's without following a link. On an error, what was moved and created is taken back out
/// through the same descriptors, so the root is as it was.
fn commit(
    target: &Target,
    staging: &Confined,
    pending: &[Pending],
    pause: Duration,
    report: &mut InstallReport,
) -> Result<(), InstallError> {
    let root_path = target.path();
    let bytes: u64 = pending.iter().map(|p| p.record.size).sum();
    let root_is_empty = match &target.dir {
        None => true,
        Some(dir) => dir.is_empty().map_err(io("read", &root_path))?,
    };
    if root_is_empty {
        let old_mode = match &target.dir {
            Some(dir) => Some(dir.stat().map_err(io("stat", &root_path))?.2),
            None => None,
        };
        // rename(2) replaces an empty directory and nothing else (a link or a file fails).
        match confined::rename_dir_over_empty(
            staging.fd(),
            STAGED_TREE,
            target.parent.fd(),
            &target.name,
        ) {
            Ok(()) => {
                // The tree took the empty root's place: give it the root's permissions.
                if let Some(mode) = old_mode {
                    let dir = target
                        .parent
                        .open_dir(&target.name)
                        .map_err(io("open", &root_path))?;
                    confined::chmod(dir.fd(), mode).map_err(io("chmod", &root_path))?;
                }
                report.files_installed = pending.len() as u64;
                report.bytes_installed = bytes;
                return Ok(());
            }
            Err(e) if target.dir.is_none() => {
                return Err(InstallError::Io {
                    op: "rename into",
                    path: root_path,
                    source: e,
                });
            }
            // The root is a mount point, or a file appeared in it: go file by file.
            Err(_) => {}
        }
    }
    let root = target.dir.as_ref().expect("an existing root");
    raise_open_file_limit();
    let mut dirs = DirCache::new(root).map_err(io("open", &root_path))?;
    let mut moved: Vec<(Arc<OwnedFd>, &str, u64, u64)> = Vec::new();
    let ordered = pending
        .iter()
        .filter(|p| !p.record.marker)
        .chain(pending.iter().filter(|p| p.record.marker));
    let mut result = Ok(());
    for p in ordered {
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
        let rel = p.record.path.as_str();
        let (dir, name) = match rel.rsplit_once('/') {
            Some((dir, name)) => (dir, name),
            None => ("", rel),
        };
        let parent = match dirs.get_or_create(dir) {
            Ok(fd) => fd,
            Err(e) => {
                result = Err(InstallError::Io {
                    op: "install under",
                    path: root.display(dir),
                    source: e,
                });
                break;
            }
        };
        let shown = staging.display(&p.staged);
        let staged = staging
            .parent_of(&p.staged)
            .and_then(|(d, n)| Ok((confined::entry_at(d.as_fd(), n)?, d, n)));
        let (identity, from_dir, from_name) = match staged {
            Ok((Some(e), d, n)) => ((e.dev, e.ino), d, n),
            Ok((None, ..)) => {
                result = Err(InstallError::Io {
                    op: "find staged",
                    path: shown,
                    source: std::io::ErrorKind::NotFound.into(),
                });
                break;
            }
            Err(e) => {
                result = Err(InstallError::Io {
                    op: "find staged",
                    path: shown,
                    source: e,
                });
                break;
            }
        };
        match confined::rename_noreplace(from_dir.as_fd(), from_name, parent.as_fd(), name) {
            Ok(()) => {
                moved.push((parent, name, identity.0, identity.1));
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
                result = Err(InstallError::Io {
                    op: "rename into",
                    path: root.display(rel),
                    source: e,
                });
                break;
            }
        }
    }
    if result.is_err() {
        // Only what this install put there: a file is removed if it is still the inode we moved.
        for (dir, name, dev, ino) in moved.iter().rev() {
            let _ = confined::remove_if_same(dir.as_fd(), name, *dev, *ino);
        }
        for (dir, name) in dirs.created.iter().rev() {
            let _ = confined::remove_dir_at(dir.as_fd(), name);
        }
        report.files_installed = 0;
        report.bytes_installed = 0;
        report.files_materialized.clear();
    }
    result
}

/// Descriptors of the root's directories the commit writes into, each opened one component at a
/// time from its parent's descriptor without following a link, and kept open so a rollback
/// reaches exactly the directories the commit used even if a name was swapped meanwhile.
struct DirCache<'r> {
    open: HashMap<&'r str, Arc<OwnedFd>>,
    /// Directories this commit created: (parent, name), top down.
    created: Vec<(Arc<OwnedFd>, &'r str)>,
}

impl<'r> DirCache<'r> {
    fn new(root: &Confined) -> std::io::Result<Self> {
        Ok(Self {
            open: HashMap::from([("", Arc::new(root.dir_fd("")?))]),
            created: Vec::new(),
        })
    }

    fn get_or_create(&mut self, dir: &'r str) -> std::io::Result<Arc<OwnedFd>> {
        if let Some(fd) = self.open.get(dir) {
            return Ok(fd.clone());
        }
        let mut at = self.open[""].clone();
        let components = dir.match_indices('/').map(|(i, _)| i).chain([dir.len()]);
        let mut start = 0;
        for end in components {
            let sofar = &dir[..end];
            let name = &dir[start..end];
            start = end + 1;
            if let Some(fd) = self.open.get(sofar) {
                at = fd.clone();
                continue;
            }
            let fd = match confined::open_dir_at(at.as_fd(), name) {
                Ok(fd) => fd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    confined::mkdir_at(at.as_fd(), name, 0o777)?;
                    self.created.push((at.clone(), name));
                    confined::open_dir_at(at.as_fd(), name)?
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR) | Some(libc::ELOOP)) => {
                    return Err(std::io::Error::other(
                        "not a directory (changed during the install)",
                    ));
                }
                Err(e) => return Err(e),
            };
            let fd = Arc::new(fd);
            self.open.insert(sofar, fd.clone());
            at = fd;
        }
        Ok(at)
    }
}

/// The commit keeps one descriptor per directory it writes into, and a cache can have thousands:
/// raise the soft limit on open files to the hard one, as file-heavy tools commonly do. (libc,
/// because rustix's `process` feature is not otherwise built and this is one call.)
fn raise_open_file_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit only read and write the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0
                && limit.rlim_cur < limit.rlim_max
            {
                limit.rlim_cur = limit.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            }
        }
    });
}

/// Removes a staging directory (std's `remove_dir_all` never follows a link). A job still writing
/// into it (after a deadline) can add an entry between the listing and the final rmdir; a few
/// tries settle it, because once the directory is unlinked the job's writes through its
/// descriptor fail.
fn remove_staging(path: &Path) {
    for _ in 0..100 {
        match fs::remove_dir_all(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                std::thread::sleep(Duration::from_millis(5));
            }
            _ => return,
        }
    }
    tracing::warn!(staging = %path.display(), "could not remove the staging directory; the next install will");
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

#[cfg(test)]
mod tests;
