//! `jitship watch`: the background publisher beside a server.
//!
//! One event loop (tokio) owns the state of every cache root and decides when a root is due for a
//! publish cycle; the cycle itself is `publish::publish` (the one publish path), run on a blocking
//! thread with the root's own `HashCache`, so files seen before are not hashed again.
//!
//! What wakes the loop, and nothing else (no polling while idle):
//! - file-system events (`fswatch`), which mark the roots they touch as changed;
//! - the earliest due time: a changed root is due once it has been quiet for the settle window,
//!   the minimum interval since its last new generation has passed and any failure backoff is over
//!   (`schedule`);
//! - the periodic rescan, the fallback for lost events (inotify overflow, network file systems):
//!   it walks each root (stat only) and marks a root changed when its listing differs from the
//!   previous rescan;
//! - while the readiness gate is closed and something is pending, a probe every `READY_POLL`;
//! - the scrub timer (`ScrubSchedule`, off by default): a sample of the kept generations' packs
//!   re-read and checked, what the fast tier lost put back from the durable tier
//!   (`crate::scrub`); the first once a cycle found the store answering, then every interval;
//! - SIGTERM/SIGINT (a message on the `stop` channel): one final publish of every root within the
//!   grace period, then return. A second signal abandons the final publish.
//!
//! Nothing is persisted: after a restart every root is pending, and the first cycle finds out from
//! the store (the head's manifest) and the disk what is left; no marker file exists to go stale.
//! One root failing (its policy, its disk, the store) is logged, counted, backed off and retried;
//! the other roots go on.
//!
//! The store may be unreachable when the watcher starts (a Mooncake master still starting): with
//! `StoreSource::Connect` each cycle first connects, on its blocking thread, and fails like any
//! store failure until the store answers, so the roots stay watched and the first cycle after it
//! answers publishes. `jitship_watch_store_reachable` and `/healthz` say which it is.
//!
//! `Loop` owns all per-root state, and every transition (an event, a root due, a cycle done,
//! a signal, the ready gate) is one of its methods, so the state machine reads top to bottom here;
//! the jobs it runs on the blocking pool, and how it takes their results back, are `jobs`;
//! scheduling, file watching and metrics, which need no state of the loop, live in submodules.

pub mod fswatch;
mod jobs;
pub mod metrics;
pub mod schedule;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::catalog::KeyLayout;
use crate::generation::ContentHash;
use crate::policy::CachePolicy;
use crate::publish::{HashCache, PublishOptions};
use crate::ready::{Probe, ReadyUrl};
use crate::store::Store;

pub(crate) use jobs::error_kind;
pub use schedule::Timing;

use fswatch::{FsWatch, Resync};
use jobs::{Bounded, JobDone, Worker, bounded, join};
use metrics::{ErrorKind, Metrics};
use schedule::{Rescan, RootSchedule};

/// Probe interval of the readiness gate while it is closed and something waits to be published.
pub const READY_POLL: Duration = Duration::from_secs(2);

/// A cache root to watch, with the policy that selects and keys its files.
pub struct WatchedRoot {
    pub kind: String,
    pub root: PathBuf,
    pub policy: std::sync::Arc<dyn CachePolicy>,
    /// The facts this root's key is built from, instead of `WatchOptions::publish`'s (the CLI
    /// gives each cache its own set: its own overrides apply to it only).
    pub facts: Option<crate::facts::Facts>,
}

pub struct WatchOptions {
    pub timing: Timing,
    /// Publish only once this answered 200.
    pub ready_url: Option<ReadyUrl>,
    /// Bound on the final publish after SIGTERM/SIGINT.
    pub grace: Duration,
    /// Serve `/metrics` and `/healthz` here.
    pub metrics_addr: Option<SocketAddr>,
    pub publish: PublishOptions,
    /// Use file notifications (true in production). False leaves only the periodic rescan, as on
    /// a file system that never delivers events; tests use it to prove the fallback alone works.
    pub notify: bool,
    /// Test hook: the number of publish cycles finished so far, sent after each one, so a test
    /// waits for a cycle instead of sleeping past it. `None` in production.
    pub cycles_finished: Option<tokio::sync::watch::Sender<u64>>,
    /// Scrub the store periodically; `None`: never.
    pub scrub: Option<ScrubSchedule>,
}

/// The periodic scrub (`[watch] scrub_interval`, `scrub_sample`).
#[derive(Clone)]
pub struct ScrubSchedule {
    pub interval: Duration,
    /// Packs one scrub reads.
    pub sample: usize,
    /// Whose heads keep generations (as `ls` judges them).
    pub trust: Arc<crate::trust::TrustPolicy>,
}

/// Connects to the store; the error says why it cannot be reached now.
pub type Connect = Arc<dyn Fn() -> Result<Arc<dyn Store>, String> + Send + Sync>;

/// The store the watcher publishes to: open already, or connected to by the first cycle that
/// finds it answering (`watch` started while the store is down).
#[derive(Clone)]
pub enum StoreSource {
    Open(Arc<dyn Store>),
    /// Not connected yet, because of `why`.
    Connect {
        connect: Connect,
        why: String,
    },
}

impl From<Arc<dyn Store>> for StoreSource {
    fn from(store: Arc<dyn Store>) -> Self {
        Self::Open(store)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("no cache roots to watch: pass --cache KIND=ROOT or add [[cache]] to the config file")]
    NoRoots,
    #[error(
        "cannot serve metrics on {addr}: {reason}; pick another --metrics-addr (or free the port)"
    )]
    MetricsBind {
        addr: SocketAddr,
        // Not `source`: the message already says it, and anyhow would print it twice.
        reason: std::io::Error,
    },
}

/// How the final publish after a stop signal went.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "final", rename_all = "kebab-case")]
pub enum FinalPublish {
    /// Every root was published (or had nothing new).
    Done,
    /// These cache kinds failed; their pending work was not published.
    Failed { caches: Vec<String> },
    /// The grace period ran out; roots not done by then were not published.
    TimedOut { unfinished: Vec<String> },
    /// A second signal cut the final publish short.
    Interrupted,
    /// The readiness gate never opened: nothing was published, as configured.
    NotReady,
}

impl std::fmt::Display for FinalPublish {
    /// For logs: "done", "failed: triton, inductor", "timed-out: triton", ...
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Done => f.write_str("done"),
            Self::Failed { caches } => write!(f, "failed: {}", caches.join(", ")),
            Self::TimedOut { unfinished } => write!(f, "timed-out: {}", unfinished.join(", ")),
            Self::Interrupted => f.write_str("interrupted"),
            Self::NotReady => f.write_str("not-ready"),
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct WatchSummary {
    /// The signal (or reason) that stopped the watcher.
    pub stopped_by: &'static str,
    pub cycles: u64,
    pub generations: u64,
    pub failed_cycles: u64,
    pub final_publish: FinalPublish,
}

struct Slot {
    kind: String,
    root: PathBuf,
    sched: RootSchedule,
    /// `None` while its cycle runs.
    worker: Option<Worker>,
    /// Digest of the root's listing at the last rescan.
    listing: Option<ContentHash>,
    /// The root itself existed at the last watch sync.
    root_existed: bool,
    /// The facts its key is built from (`WatchedRoot::facts`).
    facts: Option<crate::facts::Facts>,
}

struct Gate {
    url: Option<ReadyUrl>,
    open: bool,
    next_probe: Instant,
    /// Last probe result, so a steady "not ready" is logged once, not every 2 s.
    last: Option<Probe>,
}

struct Loop {
    /// `None` until `connect` first succeeds (`StoreSource::Connect`).
    store: Option<Arc<dyn Store>>,
    connect: Option<Connect>,
    layout: KeyLayout,
    opts: WatchOptions,
    slots: Vec<Slot>,
    fs: FsWatch,
    metrics: Arc<Metrics>,
    rescan: Rescan,
    gate: Gate,
    summary: WatchSummary,
    /// When the next scrub is due: `None` until a cycle found the store answering (or never,
    /// without `opts.scrub`).
    scrub_next: Option<std::time::Instant>,
    /// The first scrub was scheduled.
    scrub_started: bool,
}

/// Runs the watcher until a message arrives on `stop` (the CLI sends one per SIGTERM/SIGINT),
/// then publishes once more within the grace period and returns.
pub async fn run(
    store: impl Into<StoreSource>,
    layout: KeyLayout,
    roots: Vec<WatchedRoot>,
    opts: WatchOptions,
    stop: mpsc::Receiver<&'static str>,
) -> Result<WatchSummary, WatchError> {
    run_with_metrics(store, layout, roots, opts, stop, Arc::new(Metrics::new())).await
}

/// `run`, recording into `metrics` (tests read them).
pub async fn run_with_metrics(
    store: impl Into<StoreSource>,
    layout: KeyLayout,
    roots: Vec<WatchedRoot>,
    opts: WatchOptions,
    mut stop: mpsc::Receiver<&'static str>,
    metrics: Arc<Metrics>,
) -> Result<WatchSummary, WatchError> {
    if roots.is_empty() {
        return Err(WatchError::NoRoots);
    }
    if let Some(addr) = opts.metrics_addr {
        let listener = metrics::bind(addr)
            .await
            .map_err(|reason| WatchError::MetricsBind { addr, reason })?;
        let shown = listener.local_addr().unwrap_or(addr);
        tracing::info!(addr = %shown, "serving /metrics and /healthz");
        tokio::spawn(metrics::serve(listener, metrics.clone()));
    }
    let now = Instant::now();
    let slots: Vec<Slot> = roots
        .into_iter()
        .map(|r| {
            // Events carry absolute paths; a relative root would never match them.
            let root = std::path::absolute(&r.root).unwrap_or(r.root);
            Slot {
                kind: r.kind,
                root_existed: root.is_dir(),
                root,
                sched: RootSchedule::new(now.into_std()),
                worker: Some(Worker {
                    policy: r.policy,
                    hashes: HashCache::default(),
                }),
                listing: None,
                facts: r.facts,
            }
        })
        .collect();
    let (fs, fault) = FsWatch::new(opts.notify);
    let gate = Gate {
        open: opts.ready_url.is_none(),
        url: opts.ready_url.clone(),
        next_probe: now,
        last: None,
    };
    metrics.set_ready(gate.open);
    let (store, connect) = match store.into() {
        StoreSource::Open(s) => {
            metrics.set_store_unreachable(None);
            (Some(s), None)
        }
        StoreSource::Connect { connect, why } => {
            metrics.set_store_unreachable(Some(&why));
            (None, Some(connect))
        }
    };
    let mut lp = Loop {
        rescan: Rescan::new(now.into_std(), &opts.timing),
        store,
        connect,
        layout,
        opts,
        slots,
        fs,
        metrics,
        gate,
        scrub_next: None,
        scrub_started: false,
        summary: WatchSummary {
            stopped_by: "",
            cycles: 0,
            generations: 0,
            failed_cycles: 0,
            final_publish: FinalPublish::Done,
        },
    };
    if let Some(f) = fault {
        lp.fault(&f);
    }
    lp.sync_watches(Resync::RetryFailed);
    for s in &lp.slots {
        tracing::info!(
            cache = %s.kind,
            root = %s.root.display(),
            "watching{}",
            if s.root_existed { "" } else { " (the root does not exist yet; waiting for it)" }
        );
    }
    let t = lp.opts.timing;
    tracing::info!(
        settle_s = t.settle.as_secs_f64(),
        min_interval_s = t.min_interval.as_secs_f64(),
        rescan_interval_s = t.rescan_interval.as_secs_f64(),
        grace_s = lp.opts.grace.as_secs_f64(),
        ready_url = lp.gate.url.as_ref().map(ReadyUrl::as_str),
        "jitship watch started"
    );

    let (stopped_by, running) = lp.main_loop(&mut stop).await;
    tracing::info!(
        signal = %stopped_by,
        grace_s = lp.opts.grace.as_secs_f64(),
        "stopping: final publish of pending work"
    );
    lp.summary.stopped_by = stopped_by;
    lp.summary.final_publish = lp.final_publish(running, &mut stop).await;
    tracing::info!(
        cycles = lp.summary.cycles,
        generations = lp.summary.generations,
        failed_cycles = lp.summary.failed_cycles,
        final_publish = %lp.summary.final_publish,
        "jitship watch stopped"
    );
    Ok(lp.summary)
}

impl Loop {
    /// Runs until a stop message; returns its name and the job still running, if any.
    async fn main_loop(
        &mut self,
        stop: &mut mpsc::Receiver<&'static str>,
    ) -> (&'static str, Option<JoinHandle<JobDone>>) {
        let inbox = self.fs.inbox();
        let mut job: Option<JoinHandle<JobDone>> = None;
        // Every root starts pending: say so at once, not after the first wake-up.
        self.update_pending_metrics();
        loop {
            let now = Instant::now();
            if job.is_none() {
                if self.rescan.next <= now.into_std() {
                    job = Some(self.spawn_rescan());
                } else if !self.gate.open {
                    if self.any_pending() && self.gate.next_probe <= now {
                        self.probe_gate().await;
                        continue;
                    }
                } else if let Some(i) = self.earliest_due(now) {
                    job = Some(self.spawn_cycle(i));
                }
                if job.is_none()
                    && let Some(at) = self.scrub_next
                    && at <= now.into_std()
                {
                    job = self.spawn_scrub();
                }
            }
            let wake = self.next_wake();
            tokio::select! {
                sig = stop.recv() => {
                    return (sig.unwrap_or("stop channel closed"), job);
                }
                done = join(&mut job) => {
                    job = None;
                    self.finish(done);
                }
                _ = inbox.notified() => {}
                _ = tokio::time::sleep_until(wake), if job.is_none() => {}
            }
            self.handle_events();
            self.update_pending_metrics();
        }
    }

    fn any_pending(&self) -> bool {
        self.slots
            .iter()
            .any(|s| s.sched.pending && s.worker.is_some())
    }

    /// The due root that has waited longest.
    fn earliest_due(&self, now: Instant) -> Option<usize> {
        let t = &self.opts.timing;
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.worker.is_some())
            .filter_map(|(i, s)| Some((s.sched.due_at(t)?, i)))
            .filter(|(at, _)| *at <= now.into_std())
            .min()
            .map(|(_, i)| i)
    }

    /// When the loop must wake up by itself if no event comes.
    fn next_wake(&self) -> Instant {
        let mut wake = self.rescan.next;
        if let Some(at) = self.scrub_next {
            wake = wake.min(at);
        }
        if self.gate.open {
            let t = &self.opts.timing;
            if let Some(due) = self
                .slots
                .iter()
                .filter(|s| s.worker.is_some())
                .filter_map(|s| s.sched.due_at(t))
                .min()
            {
                wake = wake.min(due);
            }
        } else if self.any_pending() {
            wake = wake.min(self.gate.next_probe.into_std());
        }
        Instant::from_std(wake)
    }

    async fn probe_gate(&mut self) {
        let Some(url) = self.gate.url.clone() else {
            self.gate.open = true;
            return;
        };
        let result = crate::ready::probe(&url).await;
        if result == Probe::Ready {
            tracing::info!(url = %url.as_str(), "server is ready: publishing from now on");
            self.gate.open = true;
            self.metrics.set_ready(true);
        } else if self.gate.last.as_ref() != Some(&result) {
            tracing::info!(url = %url.as_str(), ?result, "server not ready yet: holding publishes");
        }
        self.gate.last = Some(result);
        self.gate.next_probe = Instant::now() + READY_POLL;
    }

    fn fault(&self, f: &fswatch::WatchFault) {
        self.metrics.record_error("*", f.kind);
        tracing::warn!("{}", f.message);
    }

    /// Registers the watches the roots need now; a root that just appeared is marked changed
    /// (files may have been written into it before its watch existed).
    fn sync_watches(&mut self, how: Resync) {
        let roots: Vec<PathBuf> = self.slots.iter().map(|s| s.root.clone()).collect();
        for f in self.fs.sync(&roots, how) {
            self.fault(&f);
        }
        let now = Instant::now().into_std();
        for s in &mut self.slots {
            let exists = s.root.is_dir();
            if exists != s.root_existed {
                tracing::info!(
                    cache = %s.kind,
                    root = %s.root.display(),
                    "the root {}",
                    if exists { "appeared" } else { "disappeared" }
                );
                s.root_existed = exists;
                s.sched.changed(now);
            }
        }
    }

    fn handle_events(&mut self) {
        let d = self.fs.inbox().drain();
        for f in &d.errors {
            self.fault(f);
            if f.kind == ErrorKind::WatchLimit {
                self.rescan.soon(Instant::now().into_std());
            }
        }
        if d.paths.is_empty() && !d.all_changed && !d.overflowed {
            return;
        }
        self.metrics.events();
        let now = Instant::now().into_std();
        if d.overflowed {
            tracing::warn!("file events were lost (inotify queue overflow): rescanning");
            self.metrics.record_error("*", ErrorKind::Overflow);
            self.rescan.soon(now);
        }
        for s in &mut self.slots {
            let touched = d.all_changed
                || d.overflowed
                || d.paths
                    .iter()
                    .any(|p| p.starts_with(&s.root) || s.root.starts_with(p));
            if touched {
                s.sched.changed(now);
            }
        }
        // Roots appearing or vanishing show up as events on their ancestors.
        self.sync_watches(match d.overflowed {
            true => Resync::Everything,
            false => Resync::Missing,
        });
    }

    fn update_pending_metrics(&self) {
        for s in &self.slots {
            self.metrics.set_pending(&s.kind, s.sched.pending);
        }
    }

    /// After a stop signal: wait for the running job, then publish every root once (pending
    /// ones first), retrying the failed ones once, all within the grace period.
    async fn final_publish(
        &mut self,
        running: Option<JoinHandle<JobDone>>,
        stop: &mut mpsc::Receiver<&'static str>,
    ) -> FinalPublish {
        let deadline = Instant::now() + self.opts.grace;
        if let Some(h) = running {
            match bounded(h, deadline, stop).await {
                Bounded::Done(done) => self.finish(done),
                Bounded::TimedOut => {
                    return FinalPublish::TimedOut {
                        unfinished: self.slots.iter().map(|s| s.kind.clone()).collect(),
                    };
                }
                Bounded::Interrupted => return FinalPublish::Interrupted,
            }
        }
        if !self.gate.open {
            // The server may have become ready since the last probe.
            match bounded(self.probe_gate(), deadline, stop).await {
                Bounded::Done(()) => {}
                Bounded::TimedOut => return FinalPublish::NotReady,
                Bounded::Interrupted => return FinalPublish::Interrupted,
            }
            if !self.gate.open {
                tracing::warn!(
                    "the server never reported ready: nothing published (the readiness gate holds \
                     for the final publish too)"
                );
                return FinalPublish::NotReady;
            }
        }
        let mut order: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].worker.is_some())
            .collect();
        order.sort_by_key(|&i| !self.slots[i].sched.pending);
        let mut failed: Vec<usize> = Vec::new();
        for attempt in 0..2 {
            let mut next_failed = Vec::new();
            let todo = if attempt == 0 {
                order.clone()
            } else {
                std::mem::take(&mut failed)
            };
            for (n, &i) in todo.iter().enumerate() {
                let h = self.spawn_cycle(i);
                match bounded(h, deadline, stop).await {
                    Bounded::Done(done) => {
                        self.finish(done);
                        if self.slots[i].sched.failures > 0 {
                            next_failed.push(i);
                        }
                    }
                    Bounded::TimedOut => {
                        let unfinished = todo[n..]
                            .iter()
                            .chain(&next_failed)
                            .map(|&j| self.slots[j].kind.clone())
                            .collect();
                        return FinalPublish::TimedOut { unfinished };
                    }
                    Bounded::Interrupted => return FinalPublish::Interrupted,
                }
            }
            failed = next_failed;
            if failed.is_empty() {
                return FinalPublish::Done;
            }
        }
        FinalPublish::Failed {
            caches: failed.iter().map(|&i| self.slots[i].kind.clone()).collect(),
        }
    }
}

#[cfg(test)]
mod tests;
