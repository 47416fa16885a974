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
//! then finds the files present and reports already-current. What lies beside the root is reached
//! through the parent's descriptor, never through a link, and staging names spell out the root's
//! own name so sibling roots never take each other's (`beside`); the commit checks that every
//! file it moved is in place before it reports anything installed.
//!
//! Modes: an installed file gets the published permission bits less the process's umask (read
//! once from `/proc/self/status`), and never group or other write (`stage::install_mode`): a store
//! anyone can write to cannot make a consumer's cache writable by others. Directories it creates
//! are `stage::DIR_MODE` (0755) less the umask.
//!
//! The commit moves non-marker files first, then the files the policy marks as markers (those the
//! engine finds the others through), so an engine never sees a marker before what it marks. A
//! SIGKILL during the commit (nothing can catch it) leaves some of the new files in the root, each
//! complete and verified, and markers only once all the files they mark are in; the staging
//! directory stays behind. The next install removes that staging and moves in what is missing.
//! SIGTERM and SIGINT are caught by the CLI (`crate::interrupt`, `InstallOptions::interrupt`):
//! they stop an install as its deadline does, so a commit begun finishes and the root is never
//! left half-moved by them.
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
//! on disk. Canonical or not (the flag is the manifest's word), a Triton group file naming a
//! child outside the root is refused, failing the install (every policy but the native rules).
//!
//! Once the generation is in place (installed, already current, or partly, beside conflicts), the
//! install leaves a record of it beside the root (`record`: `.<name>.jitship-installed.json`,
//! written through the parent's descriptor) for `jitship audit`.
//!
//! Size: about 600 lines with these docs: the job that picks a generation (candidates, trust,
//! fallbacks, completeness) and drives the stages, which live in the submodules.

use std::collections::{HashMap, HashSet};
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
use crate::interrupt::Interrupt;
use crate::policy::{CachePolicy, PolicyError};
use crate::scan::STAGING_PREFIX;
use crate::store::{Fetched, Store, StoreError, StoreResult};
use crate::trust::{Signer, TrustPolicy};

mod beside;
mod commit;

pub mod record;
mod report;
mod stage;
mod target;

use crate::confined::{self, Confined, Kind};
use beside::*;
use commit::*;
pub use report::*;
use stage::*;
use target::*;

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
    let before = store.tier_stats();
    let mut report = install_from(store.clone(), layout, policy, root, facts, opts);
    if let (Some(before), Some(after)) = (before, store.tier_stats()) {
        report.tiers = Some(after.since(&before));
    }
    report
}

fn install_from(
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
        store: Some(store),
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
        registry: opts.registry.clone(),
        registry_scratch: None,
        report: report.clone(),
    };
    std::thread::spawn(move || {
        let mut job = job;
        let result = job.run();
        // Read through the registry's scratch store: what each tier served.
        if let Some((_, through)) = &job.registry_scratch {
            job.report.tiers = through.tier_stats();
        }
        let _ = tx.send((result, job.report));
    });
    let (result, mut report) = match wait_for_job(&rx, started, opts.deadline, &opts.interrupt) {
        Ok(r) => r,
        Err(stopped_by) => {
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
                report.detail = stopped_by.to_string();
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

/// The job's answer, or why the install stops waiting for it: the deadline passed or the interrupt
/// was raised (looked at every 20 ms: a signal handler can only set a flag).
fn wait_for_job<T>(
    rx: &mpsc::Receiver<T>,
    started: Instant,
    deadline: Duration,
    interrupt: &Interrupt,
) -> Result<T, InstallError> {
    const INTERRUPT_POLL: Duration = Duration::from_millis(20);
    loop {
        if let Some(signal) = interrupt.signal_name() {
            return Err(InstallError::Interrupted(signal));
        }
        let left = deadline.saturating_sub(started.elapsed());
        match rx.recv_timeout(left.min(INTERRUPT_POLL)) {
            Ok(answer) => return Ok(answer),
            Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => continue,
            Err(_) => return Err(InstallError::Deadline(deadline)),
        }
    }
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
    /// `None` once the job has read all it needs from the store (`release_store`).
    store: Option<Arc<dyn Store>>,
    layout: KeyLayout,
    root: PathBuf,
    materializer: Materializer,
    compat: CompatId,
    deadline: Instant,
    gate: Arc<CommitGate>,
    fallback_depth: usize,
    commit_pause: Duration,
    trust: Arc<TrustPolicy>,
    /// The durable registry tier, until it has been asked once.
    registry: Option<Arc<crate::oci::Registry>>,
    /// What the registry served, in a scratch store on disk, which the job then reads through
    /// (`TieredStore` over the store): kept until the job ends.
    registry_scratch: Option<(tempfile::TempDir, Arc<dyn Store>)>,
    report: InstallReport,
}

/// How many heads an install passes over (refused by its trust, faulty, incomplete in the
/// store) before it gives up: anyone can write heads, so the walk is bounded whatever is there.
const MAX_PASSED_OVER: usize = 256;

/// The heads an install may take, newest first, read from the store as they are needed: the
/// newest first (an install's fixed cost), more only when it will not do.
#[derive(Default)]
struct Candidates {
    read: Vec<Result<crate::generation::HeadRecord, catalog::FaultyHead>>,
    /// No head below the last one read.
    exhausted: bool,
    /// Heads the trust admitted and that were tried: the newest and up to `fallback_depth` older.
    admitted: usize,
}

/// What to write: a file of the manifest and where it goes in staging (relative to the staging
/// directory's descriptor).
struct Pending<'m> {
    record: &'m FileRecord,
    staged: String,
}

impl Job {
    fn check_time(&self) -> Result<(), InstallError> {
        if self.gate.cancelled() || Instant::now() >= self.deadline {
            return Err(InstallError::Cancelled);
        }
        Ok(())
    }

    /// The store, until the job let go of it.
    fn store(&self) -> Result<Arc<dyn Store>, InstallError> {
        self.store.clone().ok_or_else(|| {
            InstallError::Store(StoreError::Other(
                "the install let go of the store before it was done with it (a bug in jitship)"
                    .into(),
            ))
        })
    }

    /// Lets go of the store once nothing more will be read from it. When this job holds the last
    /// reference (the CLI hands each cache's install its own and keeps none), the Mooncake
    /// client's teardown starts now, beside the rest of the install, instead of after it.
    fn release_store(&mut self) {
        self.store = None;
    }

    fn run(&mut self) -> Result<(InstallOutcome, String), InstallError> {
        let mut heads = Candidates::default();
        let mut next = 0;
        // The lock (taken once, before the root is opened: a concurrent installer may be renaming
        // a whole tree into place) and where the root lives.
        let mut locked: Option<(File, PathBuf, String)> = None;
        loop {
            let t = Instant::now();
            let picked = self.pick_complete(&mut heads, &mut next)?;
            tracing::debug!(
                ms = t.elapsed().as_millis() as u64,
                "manifest fetched and packs checked"
            );
            let Some((id, manifest)) = picked else {
                if self.repair_from_registry()? {
                    // The store has it now: walk its heads again, from the newest.
                    heads = Candidates::default();
                    next = 0;
                    self.report.passed_over.clear();
                    self.report.refused.clear();
                    continue;
                }
                return Ok(self.nothing_installable(&heads));
            };
            self.report.generation = Some(id);
            self.report.complete = Some(manifest.incomplete.is_none());
            self.report.incomplete = manifest.incomplete.clone();
            self.report.files_in_generation = manifest.files.len() as u64;
            self.check_time()?;
            if locked.is_none() {
                let t = resolve_root(&self.root)?;
                let lock = self.lock(&t)?;
                locked = Some((lock, t.parent.path().to_owned(), t.name));
                self.check_time()?;
            }
            let (_, parent_path, name) = locked.as_ref().expect("locked above");
            let target = resolve_root(&parent_path.join(name))?;
            match self.install_generation(id, &manifest, &target) {
                // Found in staging, before anything entered the root: an older generation may
                // not need that pack (a poisoned pack is never overwritten by a later put).
                Err(
                    e @ (InstallError::Corrupt { .. }
                    | InstallError::PackSize { .. }
                    | InstallError::PackVanished(_)
                    | InstallError::GroupOutsideRoot { .. }),
                ) => {
                    self.report.damaged.push(format!("generation {id}: {e}"));
                    let seq = self.report.taken_seq.take().unwrap_or(0);
                    self.pass_over(seq, Some(id), PassReason::Damaged, e.to_string());
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
        id: GenerationId,
        manifest: &Manifest,
        target: &Target,
    ) -> Result<(InstallOutcome, String), InstallError> {
        let t = Instant::now();
        let (todo, conflicts, present) =
            diff_with_disk(target.dir.as_ref(), manifest, &self.materializer)?;
        tracing::debug!(
            ms = t.elapsed().as_millis() as u64,
            missing = todo.len(),
            present,
            "compared with disk"
        );
        self.report.conflicts = conflicts;
        self.report.files_already_present = present;
        if todo.is_empty() {
            self.release_store();
        } else {
            let (staging_path, staging) = self.staging_dir(target)?;
            *self.gate.staging.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(staging_path.clone());
            let result = self.fetch_and_commit(manifest, &todo, &staging, target);
            drop(staging);
            remove_staging(&staging_path);
            result?;
        }
        let t = Instant::now();
        self.record(id, manifest, target);
        tracing::debug!(
            ms = t.elapsed().as_millis() as u64,
            "install record written"
        );
        let (outcome, mut detail) = self.outcome(id);
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
        if !self.report.passed_over.is_empty() {
            detail.push_str(&format!(
                "; passed over {} newer head(s): {}",
                self.report.passed_over.len(),
                self.passed_over()
            ));
        }
        Ok((outcome, detail))
    }

    /// What the install achieved: conflicts mean the generation is not fully on disk, whatever
    /// else was moved in.
    fn outcome(&self, id: GenerationId) -> (InstallOutcome, String) {
        let n = self.report.files_installed;
        if !self.report.conflicts.is_empty() {
            (
                InstallOutcome::Conflict,
                format!(
                    "generation {id} is only partly installed: {} of its {} files are on disk with \
                     other content or blocked (left alone); {n} installed now",
                    self.report.conflicts.len(),
                    self.report.files_in_generation
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
    fn record(&self, id: GenerationId, manifest: &Manifest, target: &Target) {
        let mut record = record::InstallRecord::of(&self.report.cache_kind, id, manifest);
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
            .passed_over
            .iter()
            .map(|p| match &p.generation {
                Some(g) => format!("seq {} (generation {g}): {}", p.seq, p.why),
                None => format!("seq {}: {}", p.seq, p.why),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Records a newer head passed over, and why (in the report and the log).
    fn pass_over(
        &mut self,
        seq: u64,
        generation: Option<GenerationId>,
        reason: PassReason,
        why: String,
    ) {
        tracing::warn!(seq, generation = ?generation, "passed over: {why}");
        self.report.passed_over.push(PassedOver {
            seq,
            generation,
            reason,
            why,
        });
    }

    /// The store has nothing to install: asks the durable registry tier (once) for the newest
    /// generation it holds that the trust admits, verified into a scratch store on disk. The job
    /// then reads through the two (`TieredStore`: the store first, the scratch store for what it
    /// lacks, put back into the store as it is read: read-repair). Served from the scratch store,
    /// the install does not depend on a full fast tier keeping what was put back; the next pod's
    /// install finds it there unless eviction took it again. True when there is something new to
    /// walk.
    fn repair_from_registry(&mut self) -> Result<bool, InstallError> {
        let Some(registry) = self.registry.take() else {
            return Ok(false);
        };
        let fast = self.store()?;
        let scratch_dir = tempfile::Builder::new()
            .prefix("jitship-registry-")
            .tempdir()
            .map_err(io(
                "creating a scratch store for the registry tier",
                &std::env::temp_dir(),
            ))?;
        let scratch: Arc<dyn Store> =
            Arc::new(crate::store::LocalStore::scratch(scratch_dir.path())?);
        let pull = registry.pull_into(
            scratch.as_ref(),
            &self.layout,
            &self.trust,
            &self.compat,
            self.deadline,
        );
        let served = pull.served.is_some();
        self.report.registry = Some(pull);
        self.check_time()?;
        if !served {
            return Ok(false);
        }
        let through: Arc<dyn Store> = Arc::new(crate::store::TieredStore::new(fast, scratch));
        self.store = Some(through.clone());
        self.registry_scratch = Some((scratch_dir, through));
        Ok(true)
    }

    /// The outcome when no candidate could be installed: `untrusted` if the trust refused every
    /// head that could have been used, `failed` if one was damaged (a corrupt or vanishing pack, a
    /// manifest of another place), else `miss`.
    fn nothing_installable(&self, heads: &Candidates) -> (InstallOutcome, String) {
        if heads.read.is_empty() {
            return (
                InstallOutcome::Miss,
                format!("no generation published yet for compat id {}", self.compat),
            );
        }
        let passed = self.passed_over();
        if !self.report.refused.is_empty() && heads.admitted == 0 {
            return (
                InstallOutcome::Untrusted,
                format!(
                    "trust mode {} admitted none of the {} head(s) found: {passed}; publish with \
                     a trusted signing key, or add the publisher's public key to [trust] \
                     trusted_keys",
                    self.trust.mode().as_str(),
                    self.report.passed_over.len(),
                ),
            );
        }
        // Data that is there but wrong, with nothing older to fall back to: a failure.
        if self
            .report
            .passed_over
            .iter()
            .any(|p| p.reason == PassReason::Damaged)
        {
            return (
                InstallOutcome::Failed,
                format!("no older complete generation to fall back to: {passed}"),
            );
        }
        (
            InstallOutcome::Miss,
            format!(
                "no usable generation for compat id {}: the {} newest head(s) tried are \
                 incomplete in the store (evicted or removed) or unusable: {passed}",
                self.compat,
                self.report.passed_over.len()
            ),
        )
    }

    /// Reads up to `n` more heads below the last one read.
    fn read_heads(
        &self,
        store: &dyn Store,
        heads: &mut Candidates,
        n: usize,
    ) -> Result<(), InstallError> {
        let mut walk = catalog::HeadWalk::new(store, &self.layout, &self.compat)?;
        if let Some(last) = heads.read.last() {
            walk.start_below(match last {
                Ok(h) => h.seq,
                Err(f) => f.seq,
            });
        }
        for _ in 0..n {
            match walk.next_head()? {
                Some(entry) => heads.read.push(entry),
                None => {
                    heads.exhausted = true;
                    break;
                }
            }
        }
        Ok(())
    }

    /// The next candidate from `heads.read[*next..]` whose head the trust admits and whose
    /// manifest and packs are all in the store right now; every head passed over is in the report
    /// with why.
    fn pick_complete(
        &mut self,
        candidates: &mut Candidates,
        next: &mut usize,
    ) -> Result<Option<(GenerationId, Manifest)>, InstallError> {
        let store = self.store()?;
        let store = store.as_ref();
        // The newest usable generation its policy recorded as incomplete, taken only when no
        // complete one follows it: (seq, id, manifest, signer, index after it).
        let mut newest_incomplete: Option<(u64, GenerationId, Manifest, Signer, usize)> = None;
        let mut passed_incomplete = Vec::new();
        loop {
            if *next == candidates.read.len() {
                if candidates.exhausted {
                    break;
                }
                // The newest alone first; then a batch, read once it does not do.
                let n = if candidates.read.is_empty() { 1 } else { 16 };
                self.read_heads(store, candidates, n)?;
                continue;
            }
            if *next >= MAX_PASSED_OVER || candidates.admitted > self.fallback_depth {
                break;
            }
            self.check_time()?;
            let entry = candidates.read[*next].clone();
            *next += 1;
            let h = match entry {
                Ok(h) => h,
                Err(f) => {
                    self.pass_over(f.seq, None, PassReason::Faulty, f.fault.to_string());
                    continue;
                }
            };
            let signer = self.trust.judge(self.layout.namespace(), &h);
            if !self
                .trust
                .admits(&signer, &format_args!("generation {}", h.generation))
            {
                self.pass_over(
                    h.seq,
                    Some(h.generation),
                    PassReason::Untrusted,
                    signer.to_string(),
                );
                self.report.refused.push(RefusedHead {
                    seq: h.seq,
                    generation: h.generation,
                    signer,
                });
                continue;
            }
            candidates.admitted += 1;
            let m = match catalog::read_manifest(store, &self.layout, &h.generation)? {
                catalog::ManifestRead::Present(m) => m,
                catalog::ManifestRead::Missing => {
                    let why = "manifest missing (evicted or removed)".to_owned();
                    self.pass_over(h.seq, Some(h.generation), PassReason::Missing, why);
                    continue;
                }
                catalog::ManifestRead::Unreadable(e) => {
                    let why = format!("manifest unreadable: {e}");
                    self.pass_over(h.seq, Some(h.generation), PassReason::Damaged, why);
                    continue;
                }
            };
            if m.compat_id != self.compat || m.cache_kind != self.report.cache_kind {
                let e = InstallError::CrossCompat {
                    head: self.compat,
                    kind: self.report.cache_kind.clone(),
                    generation: h.generation,
                    manifest_compat: m.compat_id,
                    manifest_kind: m.cache_kind.clone(),
                };
                self.pass_over(
                    h.seq,
                    Some(h.generation),
                    PassReason::Damaged,
                    e.to_string(),
                );
                continue;
            }
            if !catalog::packs_present(store, &self.layout, &m)? {
                let why = "packs missing (evicted or removed)".to_owned();
                self.pass_over(h.seq, Some(h.generation), PassReason::Missing, why);
                continue;
            }
            if m.incomplete.is_none() {
                self.report.signer = Some(signer);
                self.report.newer_incomplete = passed_incomplete;
                self.report.taken_seq = Some(h.seq);
                // The manifest decoded under the head's id, so that is its id (no re-encode).
                return Ok(Some((h.generation, *m)));
            }
            tracing::info!(generation = %h.generation, "generation is an incomplete cache; looking for an older complete one");
            passed_incomplete.push(h.generation);
            if newest_incomplete.is_none() {
                newest_incomplete = Some((h.seq, h.generation, *m, signer, *next));
            }
        }
        if *next >= MAX_PASSED_OVER {
            tracing::warn!(passed = *next, "gave up looking for an installable head");
        }
        // No complete one: the newest incomplete one, which the report marks as such. Should its
        // packs turn out damaged, the caller's next try starts after it.
        let Some((seq, id, m, signer, after)) = newest_incomplete else {
            return Ok(None);
        };
        passed_incomplete.retain(|g| *g != id);
        self.report.newer_incomplete = passed_incomplete;
        self.report.signer = Some(signer);
        self.report.taken_seq = Some(seq);
        *next = after;
        Ok(Some((id, m)))
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
        // Every pack is fetched and verified: a corrupt one would have sent the caller to an
        // older generation, which needs the store; from here on nothing does.
        self.release_store();
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
}

/// The commit keeps one descriptor per directory it writes into, and a cache can have thousands:
/// raise the soft limit on open files to the hard one, as file-heavy tools commonly do.
fn raise_open_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let limit = getrlimit(Resource::Nofile);
        if limit.current != limit.maximum {
            let raised = rustix::process::Rlimit {
                current: limit.maximum,
                ..limit
            };
            if let Err(e) = setrlimit(Resource::Nofile, raised) {
                tracing::debug!(error = %e, "could not raise the open-file limit");
            }
        }
    });
}

#[cfg(test)]
mod tests;
