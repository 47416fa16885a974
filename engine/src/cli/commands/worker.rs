//! The worker commands: publish, install, watch (the sidecar) and facts.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::cli::args::{FactsArgs, InstallArgs, PublishArgs, WatchArgs};
use crate::cli::render::{print_install, print_publish, spinner};
use crate::cli::session::Session;
use crate::config::{self, Config};
use crate::facts::FactsConfig;
use crate::install::{InstallOptions, InstallOutcome, InstallReport};
use crate::policy::set::PolicySet;
use crate::publish::{HashCache, PublishReport};
use crate::roots::{ProcessEnv, RootOrigin};

pub(crate) fn run_publish(args: PublishArgs) -> Result<i32> {
    let session = Session::open(&args.settings)?;
    let opts = session.publish_options(args.pack_size, args.pod.as_ref())?;
    let mut failed = false;
    let mut reports: Vec<PublishReport> = Vec::new();
    for cache in &session.config.caches {
        // `watch` waits for a root that does not exist yet; a one-off publish of one is a mistake
        // (a typo, an unmounted volume) and must not read as "unchanged".
        if let Err(e) = crate::publish::check_root_exists(&cache.root) {
            failed = true;
            eprintln!("{}: publish failed: {e}", cache.kind);
            continue;
        }
        let policy = session.policy(cache);
        let bar = spinner(format!(
            "publishing {} from {}",
            cache.kind,
            cache.root.display()
        ));
        let result = crate::publish::publish(
            session.store.as_ref(),
            &session.layout,
            policy.as_ref(),
            &cache.root,
            &opts,
            &mut HashCache::default(),
        );
        bar.finish_and_clear();
        match result {
            Ok(report) => {
                if !args.json {
                    print_publish(&report);
                    println!(
                        "  root {} ({})",
                        cache.root.display(),
                        session.root_origin(cache)
                    );
                }
                reports.push(report);
            }
            Err(e) => {
                failed = true;
                eprintln!("{}: publish failed: {e}", cache.kind);
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    }
    Ok(i32::from(failed))
}

pub(crate) fn run_watch(args: WatchArgs) -> Result<i32> {
    use crate::watch::{self, FinalPublish, WatchOptions, WatchedRoot};

    let session = Session::open(&args.settings)?;
    let mut wc = session.config.watch.clone();
    if let Some(v) = args.settle {
        wc.settle = v;
    }
    if let Some(v) = args.rescan_interval {
        wc.rescan_interval = v;
    }
    if let Some(v) = args.min_interval {
        wc.min_interval = v;
    }
    if let Some(v) = &args.ready_url {
        wc.ready_url = Some(v.clone());
    }
    if let Some(v) = args.grace {
        wc.grace = v;
    }
    if let Some(v) = args.metrics_addr {
        wc.metrics_addr = Some(v);
    }
    wc.validate()?;
    let ready_url = wc
        .ready_url
        .as_deref()
        .map(watch::ready::ReadyUrl::parse)
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
        publish: session.publish_options(args.pack_size, args.pod.as_ref())?,
    };
    let roots: Vec<WatchedRoot> = session
        .config
        .caches
        .iter()
        .inspect(|c| tracing::info!(cache = %c.kind, root = %c.root.display(), origin = %session.root_origin(c), "watching"))
        .map(|c| WatchedRoot {
            kind: c.kind.clone(),
            root: c.root.clone(),
            policy: session.policy(c),
        })
        .collect();
    // One thread is enough: the loop mostly sleeps, and cycles run on blocking threads.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let store = session.store.clone();
    let layout = session.layout.clone();
    let result = rt.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let (tx, rx) = tokio::sync::mpsc::channel::<String>(4);
        tokio::spawn(async move {
            loop {
                let name = tokio::select! {
                    Some(()) = term.recv() => "SIGTERM",
                    Some(()) = int.recv() => "SIGINT",
                    else => break,
                };
                if tx.send(name.into()).await.is_err() {
                    break;
                }
            }
        });
        watch::run(store, layout, roots, opts, rx)
            .await
            .map_err(anyhow::Error::from)
    });
    // A publish still running past the grace period must not hold the exit; what it wrote is
    // invisible until its head is written (invariant 1).
    rt.shutdown_background();
    let summary = result?;
    Ok(match summary.final_publish {
        FinalPublish::Done | FinalPublish::NotReady => 0,
        FinalPublish::Failed { caches } => {
            eprintln!(
                "final publish failed for {}; their pending work was not published",
                caches.join(", ")
            );
            1
        }
        FinalPublish::TimedOut { unfinished } => {
            eprintln!(
                "the grace period ran out before {} were published; raise --grace (and the pod's \
                 terminationGracePeriodSeconds)",
                unfinished.join(", ")
            );
            1
        }
        FinalPublish::Interrupted => 130,
    })
}

pub(crate) fn run_install(args: InstallArgs) -> Result<i32> {
    let session = Session::open(&args.settings)?;
    let opts = InstallOptions {
        deadline: args.deadline.unwrap_or(session.config.install.deadline),
        commit_pause: args.test_commit_pause.unwrap_or_default(),
        trust: session.trust.clone(),
        ..InstallOptions::default()
    };
    let mut reports: Vec<InstallReport> = Vec::new();
    for cache in &session.config.caches {
        let policy = session.policy(cache);
        let bar = spinner(format!(
            "installing {} into {}",
            cache.kind,
            cache.root.display()
        ));
        let report = crate::install::install(
            session.store.clone(),
            &session.layout,
            policy.clone(),
            &cache.root,
            &session.facts,
            &opts,
        );
        bar.finish_and_clear();
        if !args.json {
            print_install(&report);
            println!(
                "  root {} ({})",
                cache.root.display(),
                session.root_origin(cache)
            );
        }
        reports.push(report);
    }
    if let Some(path) = &args.report {
        let json = serde_json::to_vec_pretty(&reports)?;
        std::fs::write(path, json)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    }
    let worst = reports
        .iter()
        .map(|r| r.outcome)
        .max_by_key(|o| o.severity())
        .unwrap_or(InstallOutcome::AlreadyCurrent);
    Ok(if args.best_effort {
        0
    } else {
        worst.exit_code()
    })
}

pub(crate) fn run_facts(args: FactsArgs) -> Result<i32> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(python) = &args.python {
        config.gather.python = Some(python.clone());
    }
    let mut flag_facts = std::collections::BTreeMap::new();
    for arg in args.facts.iter().filter(|a| !a.trim().is_empty()) {
        let (k, v) = config::parse_fact_arg(arg.trim())?;
        flag_facts.insert(k, v);
    }
    let gathered = crate::facts::gather(&FactsConfig::from_process(&config, &flag_facts));
    config::apply_cache_args(&mut config, &args.caches)?;
    config.validate()?;
    let roots = resolved_roots(&config)?;
    if args.json {
        #[derive(serde::Serialize)]
        struct Output<'a> {
            #[serde(flatten)]
            gathered: &'a crate::facts::Gathered,
            roots: &'a [ResolvedRoot],
        }
        let out = Output {
            gathered: &gathered,
            roots: &roots,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", gathered.render_table());
        if !roots.is_empty() {
            println!("\ncache roots (as publish, install and watch resolve them):");
            for r in &roots {
                match (&r.origin, &r.error) {
                    (Some(origin), _) => {
                        println!("{}  {}  {origin}", r.kind, r.root.display())
                    }
                    (None, error) => println!("{}  -  {}", r.kind, error.as_deref().unwrap_or("")),
                }
            }
        }
    }
    Ok(0)
}

/// One row of the roots `jitship facts` shows.
#[derive(Debug, serde::Serialize)]
struct ResolvedRoot {
    kind: String,
    /// Empty when it cannot be resolved (`error` says why).
    root: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    origin: Option<RootOrigin>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The root of each configured cache, resolved as `Session::open` does, one at a time so that one
/// unresolvable root is shown beside the others.
fn resolved_roots(config: &Config) -> Result<Vec<ResolvedRoot>> {
    if config.caches.is_empty() {
        return Ok(Vec::new());
    }
    let policies = PolicySet::from_config(config)?;
    let env = ProcessEnv::from_process();
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
