//! The worker commands: publish, install, watch (the sidecar) and facts.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};

use serde::Serialize;

use crate::cli::args::{FactsArgs, InstallArgs, PublishArgs, WatchArgs, WatchFlags};
use crate::cli::exit;
use crate::cli::output::{self, Envelope, ErrorRecord, Stage};
use crate::cli::render::worker::{FactsView, ResolvedRoot};
use crate::cli::render::{self, Progress};
use crate::cli::session::CacheSession;
use crate::config::Config;
use crate::facts::{AppliedOverride, FactsConfig, Gathered};
use crate::install::recorded::RecordedChecks;
use crate::install::{InstallOptions, InstallOutcome, InstallReport};
use crate::interrupt::Interrupt;
use crate::policies::PolicySet;
use crate::publish::{PublishOptions, PublishReport};
use crate::roots::ProcessEnv;

/// One cache's publish: its report, or why it failed.
#[derive(Debug, Serialize)]
#[serde(untagged)]
// One value per cache, built once and rendered: the size difference costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub(crate) enum PublishResult {
    Done(PublishReport),
    Failed(FailedCache),
}

/// One cache's result in a JSON envelope, with the facts its own overrides (`[[cache]] facts`,
/// `--fact KIND:NAME=VALUE`) set for its key: name -> value and layer; absent when none did.
#[derive(Debug, Serialize)]
struct WithOwnFacts<'a, R> {
    #[serde(flatten)]
    result: &'a R,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    fact_overrides: &'a BTreeMap<String, AppliedOverride>,
}

/// Each result beside its cache's own overrides (same order).
fn with_own_facts<'a, R>(
    results: &'a [R],
    own: &'a [BTreeMap<String, AppliedOverride>],
) -> Vec<WithOwnFacts<'a, R>> {
    results
        .iter()
        .zip(own)
        .map(|(result, fact_overrides)| WithOwnFacts {
            result,
            fact_overrides,
        })
        .collect()
}

/// A cache whose work failed (`outcome` is always "failed"); the error is also under `errors`.
#[derive(Debug, Serialize)]
pub(crate) struct FailedCache {
    pub(crate) cache_kind: String,
    pub(crate) root: PathBuf,
    pub(crate) outcome: &'static str,
    pub(crate) error: String,
}

pub(crate) fn run_publish(args: PublishArgs) -> Result<i32> {
    // Before anything else: a signal while the session opens must find its handler.
    let interrupt = Interrupt::on_signals().context("installing the SIGTERM/SIGINT handlers")?;
    let mut envelope = Envelope::start("publish");
    // Each cache's result, with where its root came from when the environment decided it.
    let mut results: Vec<PublishResult> = Vec::new();
    let mut origins: Vec<Option<String>> = Vec::new();
    let mut own_facts: Vec<BTreeMap<String, AppliedOverride>> = Vec::new();
    let opened = CacheSession::open(&args.settings).and_then(|session| {
        let opts = PublishOptions {
            interrupt: interrupt.clone(),
            ..session.publish_options(args.pack_size, args.pod.as_ref())?
        };
        Ok((session, opts))
    });
    match opened {
        Err(e) => {
            if !args.json {
                return Err(e);
            }
            render::print_error(&e);
            envelope
                .errors
                .push(ErrorRecord::new(None, Stage::Config, &e));
        }
        Ok((session, opts)) => {
            for cache in &session.config.caches {
                origins.push(session.resolved_origin(cache));
                let facts = session.facts_of(cache);
                own_facts.push(facts.own_overrides.clone());
                // This cache's own facts: another cache's overrides never reach its key.
                let opts = PublishOptions {
                    facts: facts.facts.clone(),
                    ..opts.clone()
                };
                let failed = |record: ErrorRecord| FailedCache {
                    cache_kind: cache.kind.clone(),
                    root: cache.root.clone(),
                    outcome: "failed",
                    error: record
                        .causes
                        .iter()
                        .fold(record.message.clone(), |a, c| format!("{a}: {c}")),
                };
                let (store, policy) = match session.ready(cache) {
                    Ok(ready) => ready,
                    Err(shared) => {
                        let record = shared.record(&cache.kind);
                        results.push(PublishResult::Failed(failed(record.clone())));
                        envelope.errors.push(record);
                        continue;
                    }
                };
                let progress = Progress::start(format!(
                    "publishing {} from {}",
                    cache.kind,
                    cache.root.display()
                ));
                // `watch` waits for a root that does not exist yet; a one-off publish of one is a
                // mistake (a typo, an unmounted volume) and must not read as "unchanged".
                let result = crate::publish::check_root_exists(&cache.root).and_then(|()| {
                    crate::publish::publish(
                        store.as_ref(),
                        &session.layout,
                        policy.as_ref(),
                        &cache.root,
                        &opts,
                        None,
                    )
                });
                progress.finish();
                match result {
                    Ok(report) => {
                        // Published in the store, but not durable: an error an operator sees.
                        if let Some(e) = report.registry.as_ref().and_then(|r| r.error.as_ref()) {
                            envelope.errors.push(ErrorRecord::new(
                                Some(&cache.kind),
                                Stage::Store,
                                &anyhow::anyhow!("pushing to the durable registry tier: {e}"),
                            ));
                        }
                        results.push(PublishResult::Done(report));
                    }
                    Err(e) => {
                        let stage = exit::publish_stage(&e);
                        let record =
                            ErrorRecord::new(Some(&cache.kind), stage, &anyhow::Error::new(e));
                        results.push(PublishResult::Failed(failed(record.clone())));
                        envelope.errors.push(record);
                    }
                }
            }
        }
    }
    let code = if let Some(code) = exit::stopped(&interrupt) {
        code
    } else if envelope.errors.is_empty() {
        exit::OK
    } else {
        exit::ERROR
    };
    if args.json {
        let results = with_own_facts(&results, &own_facts);
        print!("{}", output::to_text(&envelope.finish(&results, code)));
    } else {
        for ((r, origin), own) in results.iter().zip(&origins).zip(&own_facts) {
            match r {
                PublishResult::Done(report) => render::worker::publish(report),
                PublishResult::Failed(f) => {
                    render::print_failed(&f.cache_kind, "publish failed", &f.error)
                }
            }
            let root = match r {
                PublishResult::Done(report) => &report.root,
                PublishResult::Failed(f) => &f.root,
            };
            render::print_root(root, origin.as_deref());
            render::worker::own_facts(own);
        }
    }
    Ok(code)
}

pub(crate) fn run_watch(args: WatchArgs) -> Result<i32> {
    use tokio::signal::unix::{SignalKind, signal};

    // One thread is enough: the loop mostly sleeps, and cycles run on blocking threads.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // The handlers go in before the store is opened: a SIGTERM while the session starts (a pod
    // stopped during its first seconds) is then kept for the loop, which stops at once and tears
    // the Mooncake client down, instead of killing the process with its client entry left in
    // the metadata server.
    let (mut term, mut int) = {
        let _in_runtime = rt.enter();
        (
            signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        )
    };
    // A store that does not answer yet (its master starts after this sidecar) is waited for,
    // not a reason to exit and crash-loop.
    let (session, source) = CacheSession::open(&args.settings)?.into_watch_session()?;
    let mut watcher = Watcher::new(&session, &args.flags, None)?;
    watcher.store = source;
    let result = rt.block_on(async move {
        let (tx, rx) = tokio::sync::mpsc::channel::<&'static str>(4);
        tokio::spawn(async move {
            loop {
                let name = tokio::select! {
                    Some(()) = term.recv() => "SIGTERM",
                    Some(()) = int.recv() => "SIGINT",
                    else => break,
                };
                if tx.send(name).await.is_err() {
                    break;
                }
            }
        });
        watcher.run(rx).await
    });
    // A publish still running past the grace period must not hold the exit; what it wrote is
    // invisible until its head is written (invariant 1).
    rt.shutdown_background();
    Ok(final_publish_code(&result?))
}

/// What `watch` (and `run` beside its server) hands the watch loop: built from an open session
/// and the watch flags, with the settings of the config's [watch] below the flags.
pub(crate) struct Watcher {
    pub(crate) store: crate::watch::StoreSource,
    layout: crate::catalog::KeyLayout,
    roots: Vec<crate::watch::WatchedRoot>,
    pub(crate) opts: crate::watch::WatchOptions,
    metrics: std::sync::Arc<crate::watch::metrics::Metrics>,
}

impl Watcher {
    /// `default_ready_url` is the readiness URL when neither the flags nor the config give one
    /// (`run`: the engine's health endpoint).
    pub(crate) fn new(
        session: &crate::cli::session::Session,
        flags: &WatchFlags,
        default_ready_url: Option<String>,
    ) -> Result<Self> {
        use crate::watch::{self, WatchOptions, WatchedRoot};
        let mut wc = session.config.watch.clone();
        if let Some(v) = flags.settle {
            wc.settle = v;
        }
        if let Some(v) = flags.rescan_interval {
            wc.rescan_interval = v;
        }
        if let Some(v) = flags.min_interval {
            wc.min_interval = v;
        }
        if let Some(v) = &flags.ready_url {
            wc.ready_url = Some(v.clone());
        }
        if wc.ready_url.is_none() {
            wc.ready_url = default_ready_url;
        }
        if let Some(v) = flags.grace {
            wc.grace = v;
        }
        if let Some(v) = flags.metrics_addr {
            wc.metrics_addr = Some(v);
        }
        if let Some(v) = flags.scrub_interval {
            wc.scrub_interval = v;
        }
        if let Some(v) = flags.scrub_sample {
            wc.scrub_sample = v;
        }
        wc.validate()?;
        let ready_url = wc
            .ready_url
            .as_deref()
            .map(crate::ready::ReadyUrl::parse)
            .transpose()?;
        let opts = WatchOptions {
            timing: watch::Timing {
                settle: wc.settle,
                min_interval: wc.min_interval,
                rescan_interval: wc.rescan_interval,
            },
            ready_url,
            grace: wc.grace,
            metrics_addr: wc.metrics_addr,
            notify: true,
            cycles_finished: None,
            scrub: (!wc.scrub_interval.is_zero()).then(|| watch::ScrubSchedule {
                interval: wc.scrub_interval,
                sample: wc.scrub_sample,
                trust: session.trust.clone(),
            }),
            publish: session.publish_options(flags.pack_size, flags.pod.as_ref())?,
        };
        let roots: Vec<WatchedRoot> = session
            .config
            .caches
            .iter()
            .inspect(|c| tracing::info!(cache = %c.kind, root = %c.root.display(), origin = %session.root_origin(c), "watching"))
            .map(|c| {
                let facts = session.facts_of(c);
                for (name, o) in &facts.own_overrides {
                    tracing::info!(cache = %c.kind, fact = %name, value = %o.value, origin = %o.origin, "fact of this cache only");
                }
                WatchedRoot {
                    kind: c.kind.clone(),
                    root: c.root.clone(),
                    policy: session.policy(c),
                    facts: Some(facts.facts.clone()),
                }
            })
            .collect();
        // /healthz and `policy_disabled` say which kinds are disabled or paused, and why.
        let metrics = std::sync::Arc::new(watch::metrics::Metrics::new());
        let policies = session.policies.clone();
        metrics.watch_policies(std::sync::Arc::new(move || policies.status()));
        Ok(Self {
            store: session.store.clone().into(),
            layout: session.layout.clone(),
            roots,
            opts,
            metrics,
        })
    }

    /// The watch loop until a message on `stop`, then its final publish (`watch::run`).
    pub(crate) async fn run(
        self,
        stop: tokio::sync::mpsc::Receiver<&'static str>,
    ) -> Result<crate::watch::WatchSummary> {
        crate::watch::run_with_metrics(
            self.store,
            self.layout,
            self.roots,
            self.opts,
            stop,
            self.metrics,
        )
        .await
        .map_err(anyhow::Error::from)
    }
}

/// `watch`'s exit code for how its final publish went (said on stderr when it failed).
pub(crate) fn final_publish_code(summary: &crate::watch::WatchSummary) -> i32 {
    use crate::watch::FinalPublish;
    match &summary.final_publish {
        FinalPublish::Done | FinalPublish::NotReady => exit::OK,
        FinalPublish::Failed { caches } => {
            eprintln!(
                "final publish failed for {}; their pending work was not published",
                caches.join(", ")
            );
            exit::ERROR
        }
        FinalPublish::TimedOut { unfinished } => {
            eprintln!(
                "the grace period ran out before {} were published; raise --grace (and the pod's \
                 terminationGracePeriodSeconds)",
                unfinished.join(", ")
            );
            exit::ERROR
        }
        FinalPublish::Interrupted => exit::INTERRUPTED,
    }
}

pub(crate) fn run_install(args: InstallArgs) -> Result<i32> {
    // Before anything else: a signal while the session opens must find its handler.
    let interrupt = Interrupt::on_signals().context("installing the SIGTERM/SIGINT handlers")?;
    install_caches(&args, &interrupt)
}

/// `install`, stopped by `interrupt` (`run` raises it from its own signal handling).
pub(crate) fn install_caches(args: &InstallArgs, interrupt: &Interrupt) -> Result<i32> {
    let mut envelope = Envelope::start("install");
    let mut reports: Vec<InstallReport> = Vec::new();
    let mut origins: Vec<Option<String>> = Vec::new();
    let mut own_facts: Vec<BTreeMap<String, AppliedOverride>> = Vec::new();
    // The deadline counts from the process's start: opening the session (connecting to the
    // store, gathering facts) spends it too.
    let started = crate::install::process_start();
    let mut recorded = RecordedChecks::default();
    let opened = args.settings.resolve().and_then(|config| {
        let deadline = args.deadline.unwrap_or(config.install.deadline);
        // Whether each root is already as its last install left it: looked at on the disk while
        // the store is being opened and facts gathered (every pod restart's whole cost).
        recorded = RecordedChecks::start(
            config
                .caches
                .iter()
                .map(|c| (c.kind.as_str(), c.root.as_path())),
        );
        open_within(config, started + deadline, deadline, interrupt)
    });
    match opened {
        // Even a configuration error must not block an init container: with --best-effort,
        // --report or --json it becomes the report's error, and the exit code follows.
        Err(e) => {
            if !(args.best_effort || args.json || args.report.is_some()) {
                return Err(e);
            }
            render::print_error(&e);
            envelope
                .errors
                .push(ErrorRecord::new(None, Stage::Config, &e));
        }
        // Out of time (or stopped by a signal) before the store was open: each cache says so.
        Ok(Err(stopped)) => {
            for report in stopped {
                envelope.errors.push(ErrorRecord::text(
                    Some(&report.cache_kind),
                    Stage::Store,
                    report.detail.clone(),
                ));
                reports.push(report);
                origins.push(None);
                own_facts.push(BTreeMap::new());
            }
        }
        Ok(Ok((mut session, deadline))) => {
            let opts = InstallOptions {
                deadline,
                started: Some(started),
                commit_pause: args.test_commit_pause.unwrap_or_default(),
                trust: session.trust.clone(),
                registry: session.registry.clone(),
                interrupt: interrupt.clone(),
                recorded,
                ..InstallOptions::default()
            };
            let ready = session.ready_each();
            for (cache, ready) in session.config.caches.iter().zip(ready) {
                origins.push(session.resolved_origin(cache));
                let facts = session.facts_of(cache);
                own_facts.push(facts.own_overrides.clone());
                let (report, stage) = match ready {
                    Ok((store, policy)) => {
                        let progress = Progress::start(format!(
                            "installing {} into {}",
                            cache.kind,
                            cache.root.display()
                        ));
                        let report = crate::install::install(
                            store,
                            &session.layout,
                            policy,
                            &cache.root,
                            &facts.facts,
                            &opts,
                        );
                        progress.finish();
                        // No compatibility key: the policy refused (a missing fact) or failed.
                        let stage = if report.compat_key.is_none() {
                            Stage::Policy
                        } else {
                            Stage::Run
                        };
                        (report, stage)
                    }
                    Err(shared) => (
                        InstallReport::failed(&cache.kind, &cache.root, shared.one_line()),
                        shared.stage,
                    ),
                };
                if matches!(
                    report.outcome,
                    InstallOutcome::Failed | InstallOutcome::Deadline
                ) {
                    envelope.errors.push(ErrorRecord::text(
                        Some(&cache.kind),
                        stage,
                        report.detail.clone(),
                    ));
                }
                reports.push(report);
            }
        }
    }
    let mut code = if let Some(code) = exit::stopped(interrupt) {
        code
    } else if envelope.errors.iter().any(|e| e.stage == Stage::Config) {
        exit::ERROR
    } else {
        exit::install(reports.iter().map(|r| r.outcome), false)
    };
    let mut doc = envelope.finish(with_own_facts(&reports, &own_facts), code);
    if let Some(path) = &args.report
        && let Err(e) = write_report(path, &output::to_text(&doc))
    {
        render::print_error(&e);
        envelope
            .errors
            .push(ErrorRecord::new(None, Stage::Report, &e));
        code = code.max(exit::ERROR);
        doc = envelope.finish(with_own_facts(&reports, &own_facts), code);
    }
    if args.json {
        print!("{}", output::to_text(&doc));
    } else {
        for ((report, origin), own) in reports.iter().zip(&origins).zip(&own_facts) {
            render::worker::install(report);
            render::print_root(&report.root, origin.as_deref());
            render::worker::own_facts(own);
        }
    }
    // A stopped install says so even with --best-effort: it is no outcome of the install.
    Ok(if args.best_effort && !interrupt.requested() {
        exit::OK
    } else {
        code
    })
}

/// Opens the session on a thread of its own and waits for it until `deadline` (`allowed` after
/// the process started) or a signal: connecting to a store that never answers must not hold the
/// install past its deadline. Out of time or stopped, a report per configured cache saying so
/// (`deadline` or `failed`); the abandoned opening ends with the process.
fn open_within(
    config: Config,
    deadline: std::time::Instant,
    allowed: std::time::Duration,
    interrupt: &Interrupt,
) -> Result<std::result::Result<(CacheSession, std::time::Duration), Vec<InstallReport>>> {
    let caches: Vec<(String, std::path::PathBuf)> = config
        .caches
        .iter()
        .map(|c| (c.kind.clone(), c.root.clone()))
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("open-session".into())
        .spawn(move || {
            let _ = tx.send(CacheSession::open_resolved(config));
        })
        .context("starting the thread that opens the store")?;
    let stopped = match crate::install::wait_for_job(&rx, deadline, allowed, interrupt) {
        Ok(session) => return Ok(Ok((session?, allowed))),
        Err(stopped) => stopped,
    };
    let outcome = match stopped {
        crate::install::InstallError::Deadline(_) => InstallOutcome::Deadline,
        _ => InstallOutcome::Failed,
    };
    let detail = format!("{stopped} (still opening the store)");
    Ok(Err(caches
        .iter()
        .map(|(kind, root)| {
            let mut report = InstallReport::failed(kind, root, detail.clone());
            report.outcome = outcome;
            report
        })
        .collect()))
}

/// Writes the report next to its final name and renames it into place, so a reader never sees a
/// half-written report.
fn write_report(path: &std::path::Path, text: &str) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("writing the report to {}", path.display()))?;
    std::io::Write::write_all(&mut tmp, text.as_bytes())
        .with_context(|| format!("writing the report to {}", path.display()))?;
    tmp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("writing the report to {}", path.display()))?;
    Ok(())
}

pub(crate) fn run_facts(args: FactsArgs) -> Result<i32> {
    let mut config = args.resolve()?;
    let overrides = config.fact_overrides();
    let facts_config = FactsConfig::from_process(&config.gather, &overrides);
    let probed = crate::facts::probe(&facts_config);
    let gathered = probed.with_overrides(&facts_config.overrides);
    let engine = engine_caches(&mut config, &gathered.facts)?;
    // Each cache with overrides of its own: what they change in the command-wide set.
    let caches: BTreeMap<&str, Gathered> = overrides
        .cache_kinds()
        .into_iter()
        .map(|kind| {
            let own = probed.with_overrides(&overrides.layers(Some(kind)));
            (kind, own.changed_from(&gathered))
        })
        .collect();
    let roots = resolved_roots(&config)?;
    let view = FactsView {
        gathered: &gathered,
        engine: engine.as_ref().map(|e| e.why.as_str()),
        caches: &caches,
        roots: &roots,
    };
    render::worker::facts(&view, args.json);
    Ok(exit::OK)
}

/// `--engine`: keeps the engine's candidate caches it reads here, decided on a copy whose roots
/// are resolved (so `resolved_roots` still shows where each came from).
fn engine_caches(
    config: &mut Config,
    facts: &crate::facts::Facts,
) -> Result<Option<crate::engines::EngineCaches>> {
    if config.engine.is_none() {
        return Ok(None);
    }
    let env = crate::engines::engine_env(config.engine, ProcessEnv::from_process());
    let mut resolved = config.clone();
    let policies = PolicySet::from_config(&resolved)?;
    let mut origins = crate::roots::resolve_cache_roots(&mut resolved.caches, &policies, &env)?;
    let chosen = crate::engines::keep_read_caches(&mut resolved, &mut origins, &env, facts);
    config
        .caches
        .retain(|c| resolved.caches.iter().any(|r| r.kind == c.kind));
    Ok(chosen)
}

/// The root of each configured cache, resolved as `Session::open` does, one at a time so that one
/// unresolvable root is shown beside the others.
fn resolved_roots(config: &Config) -> Result<Vec<ResolvedRoot>> {
    if config.caches.is_empty() {
        return Ok(Vec::new());
    }
    let policies = PolicySet::from_config(config)?;
    let env = crate::engines::engine_env(config.engine, ProcessEnv::from_process());
    Ok(config
        .caches
        .iter()
        .map(|cache| {
            let mut one = [cache.clone()];
            match crate::roots::resolve_cache_roots(&mut one, &policies, &env) {
                Ok(origins) => ResolvedRoot {
                    kind: cache.kind.clone(),
                    root: one[0].root.clone(),
                    origin: origins.into_iter().next(),
                    error: None,
                },
                Err(e) => ResolvedRoot {
                    kind: cache.kind.clone(),
                    root: PathBuf::new(),
                    origin: None,
                    error: Some(e.to_string()),
                },
            }
        })
        .collect())
}
