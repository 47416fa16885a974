//! The loop's jobs on the blocking pool (a root's publish cycle, a rescan, a scrub), and what
//! the loop takes back from them: the cycle's report or its error's kind, and its log line.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::generation::{ContentHash, ContentHasher};
use crate::policy::CachePolicy;
use crate::publish::{HashCache, PublishError, PublishOutcome, PublishReport};
use crate::store::Store;

use super::Loop;
use super::fswatch::Resync;
use super::metrics::ErrorKind;

/// What a root needs to run a cycle; moved to the blocking thread and back.
pub(super) struct Worker {
    pub(super) policy: std::sync::Arc<dyn CachePolicy>,
    pub(super) hashes: HashCache,
}

pub(super) type CycleResult = Result<PublishReport, CycleError>;

/// Why a publish cycle failed: the metric's kind, and the error in words.
pub(super) struct CycleError {
    kind: ErrorKind,
    message: String,
    /// The store did not answer (down, unreachable, timed out), as opposed to refusing something.
    unreachable: bool,
}

pub(super) enum JobDone {
    Cycle {
        index: usize,
        worker: Worker,
        // Boxed: a report is much larger than a rescan's result.
        result: Box<CycleResult>,
        /// The store this cycle connected to, when the watcher had none yet.
        connected: Option<Arc<dyn Store>>,
    },
    Rescan {
        listings: Vec<Result<ContentHash, String>>,
    },
    Scrub {
        result: Result<crate::scrub::ScrubReport, String>,
    },
}

/// Awaits the running job, or forever when there is none.
pub(super) async fn join(
    job: &mut Option<JoinHandle<JobDone>>,
) -> Result<JobDone, tokio::task::JoinError> {
    match job.as_mut() {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}

/// The outcome of waiting for something during the final publish.
pub(super) enum Bounded<T> {
    Done(T),
    TimedOut,
    Interrupted,
}

pub(super) async fn bounded<F: std::future::Future>(
    fut: F,
    deadline: Instant,
    stop: &mut mpsc::Receiver<&'static str>,
) -> Bounded<F::Output> {
    tokio::select! {
        out = fut => Bounded::Done(out),
        _ = tokio::time::sleep_until(deadline) => Bounded::TimedOut,
        Some(sig) = stop.recv() => {
            tracing::warn!("{sig} again: abandoning the final publish");
            Bounded::Interrupted
        }
    }
}

/// The one classification of a failed publish: the metrics label here, the error stage of
/// `jitship publish` (`cli::exit::publish_stage`).
pub(crate) fn error_kind(e: &PublishError) -> ErrorKind {
    match e {
        PublishError::Policy { .. }
        | PublishError::PolicyContract(..)
        | PublishError::Canonicalize { .. } => ErrorKind::Policy,
        PublishError::Scan { .. } | PublishError::RootMissing(_) | PublishError::RootNotDir(_) => {
            ErrorKind::Scan
        }
        PublishError::Read { .. } => ErrorKind::Read,
        PublishError::Store(_) => ErrorKind::Store,
        PublishError::Catalog(_) => ErrorKind::Catalog,
        // Both: other writers kept this publisher's head from being the one readers reach.
        PublishError::Contention(_)
        | PublishError::Unreachable { .. }
        | PublishError::Flooded { .. } => ErrorKind::Contention,
        PublishError::NoSigningKey => ErrorKind::Config,
        // Too many files for one generation on this store, or a pack size the store refuses.
        PublishError::ManifestTooLarge { .. } | PublishError::PackSizeOverLimit { .. } => {
            ErrorKind::Config
        }
        // The watcher passes no interrupt of its own (it stops through its loop); only a library
        // caller that raises one gets here.
        PublishError::Interrupted(_) => ErrorKind::Interrupted,
    }
}

/// The store did not answer, as opposed to refusing (full, too large): the failures that pass
/// by themselves, which `/healthz` reports as "store unreachable".
pub(super) fn store_unreachable(e: &PublishError) -> bool {
    matches!(e, PublishError::Store(e) if e.is_transient())
}

pub(super) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// Digest of a root's listing (paths, sizes, mtimes, inodes): equal digests, nothing changed.
pub(super) fn listing_digest(root: &std::path::Path) -> Result<ContentHash, String> {
    let snap = crate::scan::snapshot(root).map_err(|e| e.to_string())?;
    let mut h = ContentHasher::new();
    for f in &snap.files {
        h.update(f.path.as_str().as_bytes());
        h.update(&[0]);
        h.update(&f.size.to_le_bytes());
        h.update(&f.mtime_s.to_le_bytes());
        h.update(&f.mtime_ns.to_le_bytes());
        h.update(&f.ino.to_le_bytes());
    }
    for (p, _) in &snap.unpublishable {
        h.update(p.as_bytes());
        h.update(&[1]);
    }
    Ok(h.finish())
}

impl Loop {
    pub(super) fn spawn_cycle(&mut self, index: usize) -> JoinHandle<JobDone> {
        let slot = &mut self.slots[index];
        let now = Instant::now().into_std();
        slot.sched.cycle_started(now);
        self.metrics.set_pending(&slot.kind, false);
        let mut worker = slot
            .worker
            .take()
            .expect("earliest_due only picks roots whose worker is home");
        let root = slot.root.clone();
        let store = self.store.clone();
        let connect = self.connect.clone();
        let layout = self.layout.clone();
        let mut opts = self.opts.publish.clone();
        if let Some(facts) = &slot.facts {
            opts.facts = facts.clone();
        }
        tracing::debug!(cache = %slot.kind, root = %root.display(), "publish cycle");
        tokio::task::spawn_blocking(move || {
            let (store, connected) = match (store, connect) {
                (Some(store), _) => (store, None),
                (None, Some(connect)) => match connect() {
                    Ok(store) => (store.clone(), Some(store)),
                    Err(message) => {
                        return JobDone::Cycle {
                            index,
                            worker,
                            result: Box::new(Err(CycleError {
                                kind: ErrorKind::Store,
                                message,
                                unreachable: true,
                            })),
                            connected: None,
                        };
                    }
                },
                (None, None) => unreachable!("a watcher without a store has a way to connect"),
            };
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                crate::publish::publish(
                    store.as_ref(),
                    &layout,
                    worker.policy.as_ref(),
                    &root,
                    &opts,
                    Some(&mut worker.hashes),
                )
            }));
            let result = match result {
                Ok(Ok(report)) => Ok(report),
                Ok(Err(e)) => Err(CycleError {
                    kind: error_kind(&e),
                    message: e.to_string(),
                    unreachable: store_unreachable(&e),
                }),
                Err(p) => Err(CycleError {
                    kind: ErrorKind::Panic,
                    message: panic_message(p.as_ref()),
                    unreachable: false,
                }),
            };
            JobDone::Cycle {
                index,
                worker,
                result: Box::new(result),
                connected,
            }
        })
    }

    /// The scrub, on a blocking thread; `None` (and no more scrubs) without a schedule or store.
    pub(super) fn spawn_scrub(&mut self) -> Option<JoinHandle<JobDone>> {
        let (Some(sched), Some(store)) = (self.opts.scrub.clone(), self.store.clone()) else {
            self.scrub_next = None;
            return None;
        };
        // Not again until this one is done (`finish` sets the next).
        self.scrub_next = None;
        let layout = self.layout.clone();
        Some(tokio::task::spawn_blocking(move || {
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                crate::scrub::scrub(store.as_ref(), &layout, &sched.trust, sched.sample, true)
            }));
            JobDone::Scrub {
                result: match result {
                    Ok(Ok(report)) => Ok(report),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(p) => Err(panic_message(p.as_ref())),
                },
            }
        }))
    }

    pub(super) fn spawn_rescan(&mut self) -> JoinHandle<JobDone> {
        self.metrics.rescan();
        let roots: Vec<PathBuf> = self.slots.iter().map(|s| s.root.clone()).collect();
        tokio::task::spawn_blocking(move || JobDone::Rescan {
            listings: roots.iter().map(|r| listing_digest(r)).collect(),
        })
    }

    pub(super) fn finish(&mut self, done: Result<JobDone, tokio::task::JoinError>) {
        let now = Instant::now().into_std();
        match done {
            Ok(JobDone::Cycle {
                index,
                worker,
                result,
                connected,
            }) => {
                if let Some(store) = connected
                    && self.store.is_none()
                {
                    tracing::info!(store = %store.describe(), "the store answers: publishing");
                    self.store = Some(store);
                }
                match &*result {
                    Ok(_) => self.metrics.set_store_unreachable(None),
                    Err(e) if e.unreachable => self.metrics.set_store_unreachable(Some(&e.message)),
                    Err(_) => {}
                }
                let slot = &mut self.slots[index];
                slot.worker = Some(worker);
                self.summary.cycles += 1;
                if let Some(cycles) = &self.opts.cycles_finished {
                    cycles.send_replace(self.summary.cycles);
                }
                if self.store.is_some()
                    && !self.scrub_started
                    && self.opts.scrub.is_some()
                    && !matches!(&*result, Err(e) if e.unreachable)
                {
                    // The first scrub after the first cycle that reached the store (whatever its
                    // root's fate); then every interval.
                    self.scrub_started = true;
                    self.scrub_next = Some(now);
                }
                match *result {
                    Ok(report) => {
                        let published = matches!(report.outcome, PublishOutcome::Published { .. });
                        slot.sched.cycle_succeeded(published);
                        self.metrics.record_report(&report);
                        log_report(&report);
                        self.summary.generations += u64::from(published);
                    }
                    Err(CycleError {
                        kind,
                        message,
                        unreachable,
                    }) => {
                        let max = match unreachable {
                            true => super::schedule::STORE_MAX_BACKOFF,
                            false => super::schedule::MAX_BACKOFF,
                        };
                        slot.sched.cycle_failed(now, super::schedule::jitter(), max);
                        self.summary.failed_cycles += 1;
                        self.metrics.record_cycle_error(&slot.kind, kind);
                        let retry = slot
                            .sched
                            .due_at(&self.opts.timing)
                            .map(|at| at.saturating_duration_since(now));
                        tracing::warn!(
                            cache = %slot.kind,
                            root = %slot.root.display(),
                            error_kind = kind.as_str(),
                            store_unreachable = unreachable,
                            error = %message,
                            retry_in_s = retry.map(|d| d.as_secs()),
                            "publish cycle failed"
                        );
                    }
                }
            }
            Ok(JobDone::Scrub { result }) => {
                if let Some(sched) = &self.opts.scrub {
                    self.scrub_next = Some(now + sched.interval);
                }
                match result {
                    Ok(r) => {
                        self.metrics.record_scrub(&r);
                        let log = |unrepaired: usize| {
                            if unrepaired > 0 {
                                tracing::warn!(
                                    checked = r.checked,
                                    packs = r.packs,
                                    missing = r.missing,
                                    corrupt = r.corrupt,
                                    repaired = r.repaired,
                                    unrepaired,
                                    duration_ms = r.duration_ms,
                                    "scrub: the store lost packs kept generations need"
                                )
                            } else {
                                tracing::info!(
                                    checked = r.checked,
                                    packs = r.packs,
                                    missing = r.missing,
                                    corrupt = r.corrupt,
                                    repaired = r.repaired,
                                    duration_ms = r.duration_ms,
                                    "scrub done"
                                )
                            }
                        };
                        log(r.findings.iter().filter(|f| !f.repaired).count());
                    }
                    Err(e) => {
                        self.metrics.record_scrub_failure();
                        tracing::warn!(error = %e, "scrub failed");
                    }
                }
            }
            Ok(JobDone::Rescan { listings }) => {
                self.rescan.done(now, &self.opts.timing);
                for (slot, listing) in self.slots.iter_mut().zip(listings) {
                    match listing {
                        Ok(digest) => {
                            if slot.listing != Some(digest) {
                                // Changed since the last rescan (or first rescan): settle, then
                                // publish. Usually events saw it first and this cycle is a cheap
                                // "unchanged"; without events (lost, NFS) this is how it is seen.
                                slot.listing = Some(digest);
                                slot.sched.changed(now);
                            }
                        }
                        Err(e) => {
                            self.metrics.record_error(&slot.kind, ErrorKind::Scan);
                            tracing::warn!(cache = %slot.kind, error = %e, "rescan failed");
                        }
                    }
                }
                self.sync_watches(Resync::RetryFailed);
            }
            Err(e) => {
                // Cycles catch their panics, so this is unreachable in practice; the root whose
                // worker was lost stays out of the rotation (and the error is counted).
                self.metrics.record_error("*", ErrorKind::Panic);
                tracing::error!(error = %e, "background job failed");
                self.rescan.done(now, &self.opts.timing);
            }
        }
    }
}

pub(super) fn log_report(r: &PublishReport) {
    match &r.outcome {
        PublishOutcome::Published { generation, seq } => tracing::info!(
            cache = %r.cache_kind,
            generation = %generation,
            seq,
            files_new = r.files_new,
            files_hashed = r.files_hashed,
            bytes_uploaded = r.bytes_uploaded,
            bytes_deduplicated = r.bytes_deduplicated,
            duration_ms = r.duration_ms,
            signed_by = r.signed_by.as_deref().unwrap_or("unsigned"),
            parent = %r.parent_signer.as_ref().map_or("none".to_owned(), ToString::to_string),
            "published a new generation"
        ),
        PublishOutcome::Unchanged { generation } => tracing::debug!(
            cache = %r.cache_kind,
            generation = %generation,
            files_hashed = r.files_hashed,
            duration_ms = r.duration_ms,
            "unchanged"
        ),
        PublishOutcome::Empty => tracing::debug!(cache = %r.cache_kind, "nothing to publish yet"),
    }
    for c in &r.conflicts {
        tracing::warn!(
            cache = %r.cache_kind,
            path = %c.path,
            "a file differs from the published copy; kept the published one"
        );
    }
}
