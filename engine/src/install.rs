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
//! The phases, one module each: `pick` (candidates, trust, fallbacks, completeness), `diff` (what
//! the root already holds), `stage` (fetch packs, verify, write staging), `commit` (into the
//! root), with `beside` (lock and staging names), `target` (the root resolved once), `gate` (the
//! deadline and the commit gate) and `report` (the job's working `Progress`, made into the plain
//! `InstallReport` once, when the install ends). This file is the job that runs them in order.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use crate::catalog::KeyLayout;
use crate::confined::{self, Confined, Kind};
use crate::facts::Facts;
use crate::generation::{CompatId, FileRecord, GenerationId, Manifest};
use crate::policy::CachePolicy;
use crate::store::{Store, StoreError};
use crate::trust::TrustPolicy;

mod beside;
mod commit;
mod diff;
mod gate;
mod pick;
pub mod record;
pub mod recorded;
mod report;
mod stage;
mod target;

use beside::{lock_root, remove_staging};
use commit::commit;
use diff::diff_with_disk;
pub use gate::{CLEANUP_GRACE, mark_process_start, process_start, wait_for_job};
use gate::{CommitGate, Cutoff, bounded_cleanup};
use pick::{Candidates, Choice, PickContext, Picked, Recorded};
use recorded::{AsRecorded, RecordedChecks};
use report::Progress;
pub use report::{
    InstallError, InstallOptions, InstallOutcome, InstallReport, PassReason, PassedOver,
    RefusedHead,
};
use stage::{Materializer, Pending, Stager, staging_dir};
use target::{Target, resolve_root};

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
    install_from(store, layout, policy, root, facts, opts)
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
    let deadline = opts.started.unwrap_or(started) + opts.deadline;
    let mut progress = Progress::new(&policy.info().cache_kind, root);
    let key = match policy.compat_key(facts) {
        Ok(k) => k,
        Err(e) => {
            let detail = format!(
                "policy {} gave no compatibility key: {e}",
                policy.info().name
            );
            return progress.into_report(InstallOutcome::Failed, detail, elapsed_ms(started));
        }
    };
    let compat = CompatId::new(&progress.cache_kind, &key);
    progress.compat_key = Some(key);
    progress.compat_id = Some(compat);

    // The work runs on its own thread so the deadline holds even if a store call blocks; the
    // commit gate makes "timed out" and "moved files into the root" mutually exclusive.
    let gate = Arc::new(CommitGate::default());
    let (tx, rx) = mpsc::channel();
    let job = Job {
        tiers_before: store.tier_stats(),
        checks: opts.recorded.clone(),
        recorded: None,
        store: Some(store),
        layout: layout.clone(),
        root: root.to_owned(),
        materializer: Materializer {
            policy,
            root: root.to_owned(),
        },
        compat,
        cutoff: Cutoff {
            gate: gate.clone(),
            deadline,
        },
        fallback_depth: opts.fallback_depth,
        commit_pause: opts.commit_pause,
        trust: opts.trust.clone(),
        registry: opts.registry.clone(),
        registry_scratch: None,
        progress: progress.clone(),
    };
    let job_ended = opts.job_ended.clone();
    std::thread::spawn(move || {
        // The job is dropped at the end of this block: what it holds is let go before anyone
        // hears of its end.
        let answer = {
            let mut job = job;
            let result = job.run();
            job.release_store();
            // Read through the registry's scratch store: what each tier served.
            if let Some((_, through)) = &job.registry_scratch {
                job.progress.tiers = through.tier_stats();
            }
            (result, job.progress)
        };
        let _ = tx.send(answer);
        if let Some(ended) = job_ended {
            let _ = ended.send(());
        }
    });
    let (result, progress) = match wait_for_job(&rx, deadline, opts.deadline, &opts.interrupt) {
        Ok(r) => r,
        Err(stopped_by) => {
            if gate.cancel_unless_committing() {
                // The job may still be writing (a store call can block); it writes only through
                // the staging descriptor, so once the directory is unlinked it cannot add to it.
                // Bounded: a big staging directory must not hold the process past its deadline.
                if let Some(dir) = gate.take_staging()
                    && !bounded_cleanup(move || remove_staging(&dir))
                {
                    tracing::debug!(
                        "staging not removed within {CLEANUP_GRACE:?}; the next install removes it"
                    );
                }
                let outcome = match stopped_by {
                    InstallError::Deadline(_) => InstallOutcome::Deadline,
                    _ => InstallOutcome::Failed,
                };
                return progress.into_report(outcome, stopped_by.to_string(), elapsed_ms(started));
            }
            // The job is moving verified files into place; that is quick and must finish.
            rx.recv()
                .unwrap_or((Err(InstallError::Cancelled), progress))
        }
    };
    let (outcome, detail) = match result {
        Ok(ended) => ended,
        // The job saw the deadline pass before this thread did.
        Err(InstallError::Deadline(_) | InstallError::Cancelled) if Instant::now() >= deadline => (
            InstallOutcome::Deadline,
            InstallError::Deadline(opts.deadline).to_string(),
        ),
        Err(e) => (InstallOutcome::Failed, e.to_string()),
    };
    progress.into_report(outcome, detail, elapsed_ms(started))
}

fn elapsed_ms(started: Instant) -> u64 {
    started.elapsed().as_millis() as u64
}

struct Job {
    /// `None` once the job has read all it needs from the store (`release_store`).
    store: Option<Arc<dyn Store>>,
    /// What each tier had served when the job began (a tiered store), for the report's `tiers`.
    tiers_before: Option<crate::store::TierStats>,
    /// Where to take the already-current check of the root from (`recorded::check`).
    checks: RecordedChecks,
    /// The root as its install record says, if it is (`recorded::check`).
    recorded: Option<AsRecorded>,
    layout: KeyLayout,
    root: PathBuf,
    materializer: Materializer,
    compat: CompatId,
    cutoff: Cutoff,
    fallback_depth: usize,
    commit_pause: Duration,
    trust: Arc<TrustPolicy>,
    /// The durable registry tier, until it has been asked once.
    registry: Option<Arc<crate::oci::Registry>>,
    /// What the registry served, in a scratch store on disk, which the job then reads through
    /// (`TieredStore` over the store): kept until the job ends.
    registry_scratch: Option<(tempfile::TempDir, Arc<dyn Store>)>,
    progress: Progress,
}

impl Job {
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
        if let Some(store) = self.store.take()
            && let (Some(before), Some(after)) = (&self.tiers_before, store.tier_stats())
        {
            self.progress.tiers = Some(after.since(before));
        }
    }

    fn run(&mut self) -> Result<(InstallOutcome, String), InstallError> {
        let mut heads = Candidates::default();
        // The lock (taken once, before the root is opened: a concurrent installer may be renaming
        // a whole tree into place) and where the root lives.
        let mut locked: Option<(File, PathBuf, String)> = None;
        self.recorded = self.checks.take(&self.root, &self.progress.cache_kind);
        loop {
            let t = Instant::now();
            let picked = self.pick(&mut heads)?;
            tracing::debug!(
                ms = t.elapsed().as_millis() as u64,
                "manifest fetched and packs checked"
            );
            let picked = match picked {
                Some(Choice::Recorded(recorded)) => return Ok(self.as_recorded(recorded)),
                Some(Choice::Fetched(picked)) => Some(*picked),
                None => None,
            };
            let Some(picked) = picked else {
                if self.repair_from_registry()? {
                    // The store has it now: walk its heads again, from the newest.
                    heads = Candidates::default();
                    self.progress.passed_over.clear();
                    self.progress.refused.clear();
                    continue;
                }
                return Ok(self.nothing_installable(&heads));
            };
            let id = picked.id;
            let manifest = self.take_picked(picked);
            let target = self.lock_target(&mut locked)?;
            match self.install_generation(id, &manifest, &target) {
                // Found in staging, before anything entered the root: an older generation may
                // not need that pack (a poisoned pack is never overwritten by a later put).
                Err(
                    e @ (InstallError::Corrupt { .. }
                    | InstallError::PackSize { .. }
                    | InstallError::PackVanished(_)
                    | InstallError::GroupOutsideRoot { .. }),
                ) => {
                    self.progress.damaged.push(format!("generation {id}: {e}"));
                    let seq = self.progress.taken_seq.take().unwrap_or(0);
                    let why = e.to_string();
                    self.progress
                        .pass_over(seq, Some(id), PassReason::Damaged, why);
                    self.progress.packs_fetched = 0;
                    self.progress.bytes_fetched = 0;
                    self.progress.files_materialized.clear();
                }
                other => return other,
            }
        }
    }

    /// The root locked (once: `locked` keeps the lock for the rest of the job) and resolved
    /// again beneath the lock.
    fn lock_target(
        &self,
        locked: &mut Option<(File, PathBuf, String)>,
    ) -> Result<Target, InstallError> {
        self.cutoff.check()?;
        if locked.is_none() {
            let t = resolve_root(&self.root)?;
            let lock = lock_root(&t, &self.cutoff)?;
            *locked = Some((lock, t.parent.path().to_owned(), t.name));
            self.cutoff.check()?;
        }
        let (_, parent_path, name) = locked.as_ref().expect("locked above");
        resolve_root(&parent_path.join(name))
    }

    /// The outcome when the pick reached the generation the root holds exactly as its record
    /// says (`recorded::check`): already current, its manifest never read.
    fn as_recorded(&mut self, recorded: Recorded) -> (InstallOutcome, String) {
        let files = self.recorded.map_or(0, |r| r.files);
        self.release_store();
        let progress = &mut self.progress;
        progress.generation = Some(recorded.id);
        progress.taken_seq = Some(recorded.seq);
        progress.signer = Some(recorded.signer);
        progress.newer_incomplete = recorded.newer_incomplete;
        progress.complete = Some(true);
        progress.incomplete = None;
        progress.files_in_generation = files;
        progress.files_already_present = files;
        self.described(recorded.id, None)
    }

    /// The next generation to try (`pick`).
    fn pick(&mut self, heads: &mut Candidates) -> Result<Option<Choice>, InstallError> {
        let store = self.store()?;
        let cx = PickContext {
            store: store.as_ref(),
            layout: &self.layout,
            compat: self.compat,
            cache_kind: &self.progress.cache_kind.clone(),
            trust: &self.trust,
            fallback_depth: self.fallback_depth,
            cutoff: &self.cutoff,
            recorded: self.recorded.map(|r| r.generation),
        };
        heads.pick(&cx, &mut self.progress)
    }

    /// Puts what the report says of the picked generation into it; returns its manifest.
    fn take_picked(&mut self, picked: Picked) -> Manifest {
        let progress = &mut self.progress;
        progress.generation = Some(picked.id);
        progress.taken_seq = Some(picked.seq);
        progress.signer = Some(picked.signer);
        progress.newer_incomplete = picked.newer_incomplete;
        progress.complete = Some(picked.manifest.incomplete.is_none());
        progress.incomplete = picked.manifest.incomplete.clone();
        progress.files_in_generation = picked.manifest.files.len() as u64;
        picked.manifest
    }

    /// Installs `manifest` (the lock is held): what is missing on disk, through staging.
    fn install_generation(
        &mut self,
        id: GenerationId,
        manifest: &Manifest,
        target: &Target,
    ) -> Result<(InstallOutcome, String), InstallError> {
        let t = Instant::now();
        let diff = diff_with_disk(target.dir.as_ref(), manifest, &self.materializer)?;
        tracing::debug!(
            ms = t.elapsed().as_millis() as u64,
            missing = diff.missing.len(),
            present = diff.present,
            "compared with disk"
        );
        self.progress.conflicts = diff.conflicts;
        self.progress.files_already_present = diff.present;
        // Nothing to move in: the look-ups just made are what the record stamps.
        let looked_up = diff.missing.is_empty().then_some(diff.files_on_disk);
        if diff.missing.is_empty() {
            self.release_store();
        } else {
            let (staging_path, staging) = staging_dir(target)?;
            self.cutoff.gate.set_staging(Some(staging_path.clone()));
            let result = self.fetch_and_commit(manifest, &diff.missing, &staging, target);
            drop(staging);
            remove_staging(&staging_path);
            result?;
        }
        let t = Instant::now();
        let written = self.record(id, manifest, target, looked_up);
        tracing::debug!(
            ms = t.elapsed().as_millis() as u64,
            written,
            "install record"
        );
        Ok(self.described(id, manifest.incomplete.as_deref()))
    }

    /// The outcome of installing generation `id` (`incomplete`: why its policy said it is not
    /// whole), with its detail in words.
    fn described(&self, id: GenerationId, incomplete: Option<&str>) -> (InstallOutcome, String) {
        let (outcome, mut detail) = self.outcome(id);
        match incomplete {
            None if self.progress.newer_incomplete.is_empty() => {}
            None => detail.push_str(&format!(
                " (the newest complete cache; {} newer generation(s) are incomplete)",
                self.progress.newer_incomplete.len()
            )),
            Some(why) => detail.push_str(&format!(
                " (an INCOMPLETE cache: {why}; no complete generation among the newest {})",
                self.fallback_depth + 1
            )),
        }
        if let Some(signer) = &self.progress.signer {
            detail.push_str(&format!(" ({signer})"));
        }
        if !self.progress.passed_over.is_empty() {
            detail.push_str(&format!(
                "; passed over {} newer head(s): {}",
                self.progress.passed_over.len(),
                self.progress.passed_over_in_words()
            ));
        }
        (outcome, detail)
    }

    /// What the install achieved: conflicts mean the generation is not fully on disk, whatever
    /// else was moved in.
    fn outcome(&self, id: GenerationId) -> (InstallOutcome, String) {
        let n = self.progress.files_installed;
        if !self.progress.conflicts.is_empty() {
            (
                InstallOutcome::Conflict,
                format!(
                    "generation {id} is only partly installed: {} of its {} files are on disk with \
                     other content or blocked (left alone); {n} installed now",
                    self.progress.conflicts.len(),
                    self.progress.files_in_generation
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
    ///
    /// An install that moved nothing in stamps from the look-ups its diff made under the lock
    /// (`looked_up`: the regular files at the generation's paths); one that did looks them up
    /// again. Either way the record is written only if the one there says anything else (its
    /// time aside): an already-current install's stays as it is, and `audit` reads what it would
    /// have read from a rewrite. Whether it wrote.
    fn record(
        &self,
        id: GenerationId,
        manifest: &Manifest,
        target: &Target,
        looked_up: Option<HashMap<&str, confined::Entry>>,
    ) -> bool {
        let mut record = record::InstallRecord::of(&self.progress.cache_kind, id, manifest);
        for c in &self.progress.conflicts {
            record.files.remove(c);
        }
        record.whole = self.progress.conflicts.is_empty() && manifest.incomplete.is_none();
        // After a commit: the files as they are now, looked up a directory at a time as the diff
        // does (one look-up from the root per file doubled the cost of 20,000 files).
        let on_disk = looked_up.unwrap_or_else(|| {
            let paths: Vec<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
            let looked = target
                .parent
                .open_dir(&target.name)
                .ok()
                .and_then(|dir| diff::look_up(&dir, &paths).ok())
                .unwrap_or_default();
            paths
                .into_iter()
                .zip(looked)
                .filter_map(|(p, l)| match l {
                    diff::Looked::At(Some(e)) if e.kind == Kind::File => Some((p, e)),
                    _ => None,
                })
                .collect()
        });
        for f in manifest.files.iter().filter(|f| f.canonical) {
            if let (Some(size), Some(e)) = (
                record.files.get_mut(f.path.as_str()),
                on_disk.get(f.path.as_str()),
            ) {
                *size = e.size;
            }
        }
        let stored = record.stamped_by(|path| on_disk.get(path).copied());
        match record::write_if_changed_in(&target.parent, &target.name, stored) {
            Ok(written) => written,
            Err(e) => {
                tracing::warn!(root = %target.path().display(), "cannot write the install record: {e}");
                false
            }
        }
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
            self.cutoff.deadline,
        );
        let served = pull.served.is_some();
        self.progress.registry = Some(pull);
        self.cutoff.check()?;
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
        if heads.none_found() {
            // A store that cannot list (Mooncake) cannot tell "never published" from "lost": a
            // master restarted without HA forgets every key, and this is the operator's clue.
            let lost = match &self.store {
                Some(store) if !store.capabilities().listing => {
                    "; or the store lost it (a Mooncake master restarted without HA forgets every \
                     key): the next publish puts it back, and a durable tier (`--durable-store`) \
                     serves installs meanwhile"
                }
                _ => "",
            };
            return (
                InstallOutcome::Miss,
                format!(
                    "no generation published yet for compat id {}{lost}",
                    self.compat
                ),
            );
        }
        let passed = self.progress.passed_over_in_words();
        if !self.progress.refused.is_empty() && heads.admitted == 0 {
            return (
                InstallOutcome::Untrusted,
                format!(
                    "trust mode {} admitted none of the {} head(s) found: {passed}; publish with \
                     a trusted signing key, or add the publisher's public key to [trust] \
                     trusted_keys",
                    self.trust.mode().as_str(),
                    self.progress.passed_over.len(),
                ),
            );
        }
        // Data that is there but wrong, with nothing older to fall back to: a failure.
        if self
            .progress
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
                self.progress.passed_over.len()
            ),
        )
    }

    fn fetch_and_commit(
        &mut self,
        manifest: &Manifest,
        todo: &[&FileRecord],
        staging: &Confined,
        target: &Target,
    ) -> Result<(), InstallError> {
        let pending = Pending::all(todo);
        let stager = Stager {
            store: self.store()?,
            layout: &self.layout,
            materializer: &self.materializer,
            cutoff: &self.cutoff,
        };
        stager.write_staging(manifest, &pending, staging, &mut self.progress)?;
        // Every pack is fetched and verified: a corrupt one would have sent the caller to an
        // older generation, which needs the store; from here on nothing does.
        self.release_store();
        self.cutoff.check()?;
        // The bytes are durable before any name appears in the root; losing the renames to a
        // crash only loses the install (staging is cleaned by the next one).
        staging
            .sync_filesystem()
            .map_err(io("flush the file system of", staging.path()))?;
        if !self.cutoff.gate.enter_commit() {
            return Err(InstallError::Cancelled);
        }
        commit(
            target,
            staging,
            &pending,
            self.commit_pause,
            &mut self.progress,
        )
    }
}

#[cfg(test)]
mod tests;
