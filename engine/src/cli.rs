//! The `jitship` command line: parses flags, resolves settings (flags > JITSHIP_* env > config file
//! > defaults), runs one command and turns its outcome into output and an exit code. Every
//! decision lives in the library modules; this module only wires them.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{self, CacheConfig, Config};
use crate::facts::{Facts, FactsConfig};
use crate::generation::GenerationId;
use crate::generation::Producer;
use crate::inspect::{self, ManifestState};
use crate::install::{InstallOptions, InstallOutcome, InstallReport};
use crate::policy::CachePolicy;
use crate::policy::set::PolicySet;
use crate::publish::{HashCache, PublishOptions, PublishOutcome, PublishReport};
use crate::store::{KeyLayout, Store};

#[derive(Debug, Parser)]
#[command(
    name = "jitship",
    version,
    about = "Ship JIT and kernel caches of LLM inference workers between pods",
    long_about = "jitship publishes the JIT and kernel caches of vLLM and SGLang workers (Triton, \
TorchInductor, FlashInfer, DeepGEMM, CUDA, ...) as immutable, verified generations to a store \
(Mooncake Store, or a local directory), and installs the matching generation in seconds when the \
next worker starts.\n\nSettings come from flags, then JITSHIP_* environment variables, then the \
config file (--config), then defaults. See examples/jitship.toml for every setting."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// Log format on stderr.
    #[arg(
        long,
        global = true,
        env = "JITSHIP_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: LogFormat,

    /// More log detail (-v debug, -vv trace). RUST_LOG, when set, wins.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Publish each configured cache root as a new generation (only new files are uploaded).
    Publish(PublishArgs),
    /// Install the newest matching generation into each configured cache root.
    ///
    /// Exit codes: 0 installed, 10 already current, 11 miss (nothing published for this
    /// worker's key, or evicted), 12 failed (the root was left as it was); with several caches the
    /// most severe outcome wins. --best-effort exits 0 for all four.
    Install(InstallArgs),
    /// Watch the cache roots and publish complete new work as it appears (the sidecar).
    ///
    /// A root is published once it has been quiet for the settle window, at most once per minimum
    /// interval, and (with --ready-url) only after the server answered 200 once. On SIGTERM or
    /// SIGINT every root is published once more within the grace period. Exit codes: 0 stopped
    /// cleanly (final publish done, or held by the readiness gate), 1 the final publish failed or
    /// ran out of time, 130 a second signal cut it short.
    Watch(WatchArgs),
    /// Print the facts compatibility keys are built from, where each came from, and why each
    /// missing one is missing.
    ///
    /// GPU and driver come from NVML (or nvidia-smi, or /proc/driver/nvidia/version), Python and
    /// package versions from a bare interpreter and site-packages metadata (no import of torch).
    /// Overrides win: the config's [facts], then --fact / JITSHIP_FACTS. A policy that needs a
    /// missing fact refuses to produce a key: give it with --fact NAME=VALUE.
    Facts(FactsArgs),
    /// List compat keys and their generations: sizes, file counts, ages, pins.
    Ls(LsArgs),
    /// Show one generation: manifest, facts, producer, parent chain.
    Inspect(InspectArgs),
    /// Fetch and check every pack and every file hash of a generation (default: every generation
    /// `ls` shows). Exit codes: 0 all good, 3 a problem was found (named on the output), 1 error.
    Verify(VerifyArgs),
    /// Pin a generation: retention never drops it (until `unpin`).
    Pin(PinArgs),
    /// Remove a pin.
    Unpin(PinArgs),
    /// Apply retention: remove dropped generations, their heads and the packs nothing retained
    /// references. `--dry-run` shows what it would remove.
    Gc(GcArgs),
    /// Build, check and dry-run policy modules (for policy authors).
    #[command(subcommand)]
    Policy(PolicyCommand),
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Build a policy crate into a component jitship loads: cargo build for
    /// wasm32-unknown-unknown (profile `policy`: small, reproducible), then componentize in-process.
    /// Needs `rustup target add wasm32-unknown-unknown`; nothing else.
    Build(PolicyBuildArgs),
    /// Load a policy module the way jitship would and show what it is: contract version, info(),
    /// imports (capabilities) and exports. Exits 1, with the reason, if jitship would refuse it.
    Check(PolicyCheckArgs),
    /// Dry-run a policy: its compatibility key for the given facts (or its refusal), its publish/skip
    /// decisions with reasons for a cache root, and its retention decisions for a list of
    /// generations. Nothing is published. Exits 1 if any call failed or refused.
    Test(PolicyTestArgs),
}

#[derive(Debug, Args)]
pub struct PolicyBuildArgs {
    /// The policy crate's directory.
    #[arg(default_value = ".", value_name = "PATH-TO-CRATE")]
    pub path: PathBuf,

    /// Where to write the component (default: ./<crate lib name>.wasm).
    #[arg(short, long, value_name = "OUT.wasm")]
    pub out: Option<PathBuf>,

    /// Cargo target directory (default: the crate's own).
    #[arg(long, value_name = "DIR")]
    pub target_dir: Option<PathBuf>,

    /// Refuse to update the crate's Cargo.lock (CI, reproducible builds).
    #[arg(long)]
    pub locked: bool,

    /// Print {name, path, digest, sizes} as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The [policy] sandbox settings for author commands.
#[derive(Debug, Args)]
pub struct PolicySandboxArgs {
    /// TOML config file: its [policy] section (fuel, deadline, memory, read budget, compile cache).
    #[arg(long, env = "JITSHIP_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Compile in memory: neither read nor write the compiled-module cache (the default without
    /// --config).
    #[arg(long)]
    pub no_compile_cache: bool,
}

#[derive(Debug, Args)]
pub struct PolicyCheckArgs {
    /// The policy module (.wasm component).
    #[arg(value_name = "FILE.wasm")]
    pub file: PathBuf,

    #[command(flatten)]
    pub sandbox: PolicySandboxArgs,

    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PolicyTestArgs {
    /// The policy module (.wasm component).
    #[arg(value_name = "FILE.wasm")]
    pub file: PathBuf,

    /// A cache root to run select on (scanned as publish scans it).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,

    /// A fact as NAME=VALUE (repeatable). Only these facts are given to the policy.
    #[arg(long = "fact", value_name = "NAME=VALUE")]
    pub facts: Vec<String>,

    /// A JSON list of generations (newest first) to run retain on: [{"id", "compat_key",
    /// "created_at", "size_bytes", "file_count", "pinned"}].
    #[arg(long, value_name = "FILE.json")]
    pub generations: Option<PathBuf>,

    /// "Now" for retain, seconds since the Unix epoch (default: the current time).
    #[arg(long, value_name = "SECS")]
    pub now: Option<u64>,

    /// Retention quota handed to retain: at most this many generations.
    #[arg(long)]
    pub max_generations: Option<u32>,

    /// Retention quota handed to retain: at most this many bytes, e.g. "20 GiB".
    #[arg(long)]
    pub max_bytes: Option<bytesize::ByteSize>,

    /// Retention quota handed to retain: drop generations older than this, e.g. "7d".
    #[arg(long, value_parser = humantime::parse_duration)]
    pub max_age: Option<Duration>,

    #[command(flatten)]
    pub sandbox: PolicySandboxArgs,

    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Settings plus `--json`, for the operator commands.
#[derive(Debug, Args)]
pub struct OperatorArgs {
    #[command(flatten)]
    pub settings: SettingsArgs,

    /// Print JSON on stdout (for scripts) instead of tables.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub common: OperatorArgs,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub common: OperatorArgs,

    /// Generation id (64 hex digits, or a unique prefix of at least 8 as `ls` prints).
    pub generation: String,

    /// Also list every file.
    #[arg(long)]
    pub files: bool,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub common: OperatorArgs,

    /// Generation id or unique prefix; all generations when omitted.
    pub generation: Option<String>,
}

#[derive(Debug, Args)]
pub struct PinArgs {
    #[command(flatten)]
    pub common: OperatorArgs,

    /// Generation id or unique prefix.
    pub generation: String,

    /// Why (recorded in the pin; `pin` only).
    #[arg(long)]
    pub reason: Option<String>,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    #[command(flatten)]
    pub common: OperatorArgs,

    /// Show what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Generations to keep per compat key (overrides retention.max_generations).
    #[arg(long, value_name = "N")]
    pub keep: Option<u32>,

    /// Bytes to keep per compat key, e.g. "20 GiB" (overrides retention.max_bytes).
    #[arg(long)]
    pub max_bytes: Option<bytesize::ByteSize>,

    /// Drop generations older than this, e.g. "14d" (overrides retention.max_age).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub max_age: Option<Duration>,

    /// Remove a dropped generation only once superseded this long ago, e.g. "1h" (overrides
    /// retention.grace). Keep it above the install deadline.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub grace: Option<Duration>,
}

/// Where the store is, which caches, and the facts keys are built from.
#[derive(Debug, Args)]
pub struct SettingsArgs {
    /// TOML config file (see examples/jitship.toml).
    #[arg(long, env = "JITSHIP_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Store to use: local:DIR, mooncake (the [store.mooncake] settings) or mooncake:HOST:PORT.
    #[arg(long, env = "JITSHIP_STORE", value_name = "STORE")]
    pub store: Option<String>,

    /// Key namespace inside the store.
    #[arg(long, env = "JITSHIP_NAMESPACE")]
    pub namespace: Option<String>,

    /// A cache root as KIND=ROOT (repeatable; env: comma-separated). Overrides the config's root
    /// for that kind.
    #[arg(
        long = "cache",
        env = "JITSHIP_CACHES",
        value_name = "KIND=ROOT",
        value_delimiter = ','
    )]
    pub caches: Vec<String>,

    /// A fact as NAME=VALUE (repeatable; env: semicolon-separated). Overrides gathered facts.
    #[arg(
        long = "fact",
        env = "JITSHIP_FACTS",
        value_name = "NAME=VALUE",
        value_delimiter = ';'
    )]
    pub facts: Vec<String>,
}

#[derive(Debug, Args)]
pub struct PublishArgs {
    #[command(flatten)]
    pub settings: SettingsArgs,

    /// Largest pack object, e.g. "64 MiB".
    #[arg(long, env = "JITSHIP_PACK_SIZE")]
    pub pack_size: Option<bytesize::ByteSize>,

    /// Pod name recorded as the producer.
    #[arg(long, env = "POD_NAME")]
    pub pod: Option<String>,

    /// Print the reports as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    #[command(flatten)]
    pub settings: SettingsArgs,

    /// Bound on the whole install, e.g. "60s"; past it the roots are left as they were.
    #[arg(long, env = "JITSHIP_DEADLINE", value_parser = humantime::parse_duration)]
    pub deadline: Option<Duration>,

    /// Write the JSON report to FILE.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,

    /// Print the JSON report on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,

    /// Exit 0 whatever the outcome (for init containers that must never block a pod).
    #[arg(long, env = "JITSHIP_BEST_EFFORT")]
    pub best_effort: bool,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub settings: SettingsArgs,

    /// Quiet time after the last change before a root is published [default: 5s].
    #[arg(long, env = "JITSHIP_SETTLE", value_parser = humantime::parse_duration)]
    pub settle: Option<Duration>,

    /// Full rescan of every root this often, the fallback for lost file events [default: 60s].
    #[arg(long, env = "JITSHIP_RESCAN_INTERVAL", value_parser = humantime::parse_duration)]
    pub rescan_interval: Option<Duration>,

    /// Least time between two publishes of one root [default: 30s].
    #[arg(long, env = "JITSHIP_MIN_INTERVAL", value_parser = humantime::parse_duration)]
    pub min_interval: Option<Duration>,

    /// Publish only once this URL answered 200, e.g. http://127.0.0.1:8000/health.
    #[arg(long, env = "JITSHIP_READY_URL", value_name = "URL")]
    pub ready_url: Option<String>,

    /// Bound on the final publish after SIGTERM/SIGINT [default: 20s].
    #[arg(long, env = "JITSHIP_GRACE", value_parser = humantime::parse_duration)]
    pub grace: Option<Duration>,

    /// Serve Prometheus metrics (/metrics) and /healthz here, e.g. 0.0.0.0:9464.
    #[arg(long, env = "JITSHIP_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// Largest pack object, e.g. "64 MiB".
    #[arg(long, env = "JITSHIP_PACK_SIZE")]
    pub pack_size: Option<bytesize::ByteSize>,

    /// Pod name recorded as the producer.
    #[arg(long, env = "POD_NAME")]
    pub pod: Option<String>,
}

#[derive(Debug, Args)]
pub struct FactsArgs {
    /// TOML config file: its [facts] overrides and [gather] settings.
    #[arg(long, env = "JITSHIP_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// A fact as NAME=VALUE (repeatable; env: semicolon-separated). Overrides gathered facts.
    #[arg(
        long = "fact",
        env = "JITSHIP_FACTS",
        value_name = "NAME=VALUE",
        value_delimiter = ';'
    )]
    pub facts: Vec<String>,

    /// The inference engine's Python interpreter (default: [gather] python, then python3 on PATH).
    #[arg(long, env = "JITSHIP_PYTHON", value_name = "PATH")]
    pub python: Option<PathBuf>,

    /// Print {"facts", "sources", "missing"} as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Entry point of the binary: returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    init_logging(cli.log_format, cli.verbose);
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

fn init_logging(format: LogFormat, verbose: u8) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_target(false).init(),
        LogFormat::Json => builder.json().init(),
    }
}

pub fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Publish(args) => run_publish(args),
        Command::Install(args) => run_install(args),
        Command::Watch(args) => run_watch(args),
        Command::Facts(args) => run_facts(args),
        Command::Policy(cmd) => run_policy(cmd),
        Command::Ls(args) => run_ls(args),
        Command::Inspect(args) => run_inspect(args),
        Command::Verify(args) => run_verify(args),
        Command::Pin(args) => run_pin(args, true),
        Command::Unpin(args) => run_pin(args, false),
        Command::Gc(args) => run_gc(args),
    }
}

impl SettingsArgs {
    /// The effective configuration: config file, then env and flags on top.
    pub fn resolve(&self) -> Result<Config> {
        let mut config = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        if let Some(store) = &self.store {
            config::apply_store_arg(&mut config.store, store)?;
        }
        if let Some(ns) = &self.namespace {
            config.store.namespace = ns.clone();
        }
        for arg in &self.caches {
            let cache = config::parse_cache_arg(arg)?;
            match config.caches.iter_mut().find(|c| c.kind == cache.kind) {
                Some(existing) => existing.root = cache.root,
                None => config.caches.push(cache),
            }
        }
        for arg in &self.facts {
            let (k, v) = config::parse_fact_arg(arg)?;
            config.facts.insert(k, v);
        }
        config.validate()?;
        Ok(config)
    }
}

/// The store, key layout, facts and per-cache policies one command works with.
struct Session {
    config: Config,
    store: Arc<dyn Store>,
    layout: KeyLayout,
    facts: Facts,
    policies: PolicySet,
}

impl Session {
    fn open(settings: &SettingsArgs) -> Result<Self> {
        let mut session = Self::open_store(settings)?;
        if session.config.caches.is_empty() {
            bail!(
                "no cache roots configured: pass --cache KIND=ROOT (e.g. --cache triton=$HOME/.triton/cache) or add [[cache]] to the config file"
            );
        }
        // Keys are built from gathered facts (GPU, driver, Python, packages) with the config's
        // [facts] and the --fact flags (already merged into it) on top.
        let gathered = crate::facts::gather(&FactsConfig::from_process(
            &session.config,
            &Default::default(),
        ));
        for (name, why) in &gathered.missing {
            tracing::debug!(fact = %name, "fact missing: {why}");
        }
        session.facts = gathered.facts;
        Ok(session)
    }

    /// For commands that need the store only (ls, inspect, verify, pin, gc).
    fn open_store(settings: &SettingsArgs) -> Result<Self> {
        let config = settings.resolve()?;
        let store = crate::store::open(&config.store)
            .with_context(|| format!("opening the {:?} store", config.store.backend))?;
        let layout = KeyLayout::new(&config.store.namespace)?;
        let mut facts = Facts::new();
        facts.merge(&config.facts);
        // A policy that fails to load disables its own kind (reported by publish/install through
        // the policy's errors); only an unusable wasm engine stops the command.
        let policies = PolicySet::from_config(&config)?;
        Ok(Self {
            config,
            store,
            layout,
            facts,
            policies,
        })
    }

    fn policy(&self, cache: &CacheConfig) -> Arc<dyn CachePolicy> {
        self.policies.policy(&cache.kind)
    }

    /// The policy for a cache kind found in the store (gc): the configured one, or the kind's
    /// built-in policy when this host does not configure that kind.
    fn policy_for_kind(&self, kind: &str) -> Arc<dyn CachePolicy> {
        if self.config.caches.iter().any(|c| c.kind == kind) {
            return self.policies.policy(kind);
        }
        let mut config = self.config.clone();
        config.caches = vec![CacheConfig {
            kind: kind.to_owned(),
            root: PathBuf::new(),
            policy: None,
        }];
        match PolicySet::from_config(&config) {
            Ok(set) => set.policy(kind),
            // The set of the configured kinds answers with a disabled policy, whose retain fails:
            // gc then keeps everything of that kind.
            Err(_) => self.policies.policy(kind),
        }
    }
}

fn spinner(message: String) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        tracing::info!("{message}");
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner().with_message(message);
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

impl Session {
    fn publish_options(
        &self,
        pack_size: Option<bytesize::ByteSize>,
        pod: Option<&String>,
    ) -> PublishOptions {
        PublishOptions {
            pack_size: pack_size.unwrap_or(self.config.publish.pack_size).as_u64(),
            producer: Producer {
                host: gethostname::gethostname().to_string_lossy().into_owned(),
                pod: pod.cloned().or_else(|| self.config.publish.pod.clone()),
                jitship_version: env!("CARGO_PKG_VERSION").into(),
            },
            facts: self.facts.clone(),
            max_head_attempts: 16,
        }
    }
}

fn run_publish(args: PublishArgs) -> Result<i32> {
    let session = Session::open(&args.settings)?;
    let opts = session.publish_options(args.pack_size, args.pod.as_ref());
    let mut failed = false;
    let mut reports: Vec<PublishReport> = Vec::new();
    for cache in &session.config.caches {
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

fn print_publish(r: &PublishReport) {
    let what = match &r.outcome {
        PublishOutcome::Published { generation, seq } => {
            format!("published generation {generation} (head {seq})")
        }
        PublishOutcome::Unchanged { generation } => {
            format!("unchanged: generation {generation} already holds every file")
        }
        PublishOutcome::Empty => "nothing to publish yet".into(),
    };
    println!("{}: {what}", r.cache_kind);
    println!(
        "  {} files selected, {} new, {} hashed; uploaded {} in {} packs, {} already stored; {} ms",
        r.files_selected,
        r.files_new,
        r.files_hashed,
        bytesize::ByteSize(r.bytes_uploaded),
        r.packs_uploaded,
        bytesize::ByteSize(r.bytes_deduplicated),
        r.duration_ms
    );
    for (reason, n) in &r.skipped {
        println!("  skipped {n}: {reason}");
    }
    for c in &r.conflicts {
        println!(
            "  conflict: {} differs from the published copy (kept the published one)",
            c.path
        );
    }
}

fn run_watch(args: WatchArgs) -> Result<i32> {
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
        publish: session.publish_options(args.pack_size, args.pod.as_ref()),
    };
    let roots: Vec<WatchedRoot> = session
        .config
        .caches
        .iter()
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

fn run_install(args: InstallArgs) -> Result<i32> {
    let session = Session::open(&args.settings)?;
    let opts = InstallOptions {
        deadline: args.deadline.unwrap_or(session.config.install.deadline),
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
        reports.push(report);
    }
    if let Some(path) = &args.report {
        let json = serde_json::to_vec_pretty(&reports)?;
        std::fs::write(path, json)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        reports.iter().for_each(print_install);
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

fn print_install(r: &InstallReport) {
    let outcome = serde_json::to_value(r.outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    println!("{}: {outcome}: {}", r.cache_kind, r.detail);
    if r.outcome == InstallOutcome::Installed {
        println!(
            "  {} files ({}) into {}, {} already present; fetched {} packs ({}); {} ms",
            r.files_installed,
            bytesize::ByteSize(r.bytes_installed),
            r.root.display(),
            r.files_already_present,
            r.packs_fetched,
            bytesize::ByteSize(r.bytes_fetched),
            r.duration_ms
        );
    }
    for c in &r.conflicts {
        println!("  left alone: {c}");
    }
}

fn run_facts(args: FactsArgs) -> Result<i32> {
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
    if args.json {
        println!("{}", serde_json::to_string_pretty(&gathered)?);
    } else {
        print!("{}", gathered.render_table());
    }
    Ok(0)
}

// ---------------------------------------------------------------------------------------------
// Operator commands

fn now() -> u64 {
    crate::publish::now_secs()
}

/// "45s", "12m", "3h", "5d" ago.
fn age(then: u64) -> String {
    let s = now().saturating_sub(then);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

fn short(id: &impl std::fmt::Display) -> String {
    id.to_string().chars().take(12).collect()
}

/// Prints rows as left-aligned columns under a header.
fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

fn resolve_generation(session: &Session, text: &str) -> Result<GenerationId> {
    Ok(inspect::resolve(
        session.store.as_ref(),
        &session.layout,
        text,
    )?)
}

fn run_ls(args: LsArgs) -> Result<i32> {
    let session = Session::open_store(&args.common.settings)?;
    let survey = inspect::survey(session.store.as_ref(), &session.layout)
        .with_context(|| format!("reading {}", session.store.describe()))?;
    if args.common.json {
        println!("{}", serde_json::to_string_pretty(&survey)?);
        return Ok(0);
    }
    if survey.compats.is_empty() {
        println!(
            "no generations in namespace {:?} of {}",
            survey.namespace,
            session.store.describe()
        );
        return Ok(0);
    }
    for c in &survey.compats {
        println!(
            "{} {}  compat id {}",
            c.cache_kind.as_deref().unwrap_or("?"),
            c.compat_key.as_deref().unwrap_or("(no readable manifest)"),
            short(&c.compat_id)
        );
        let rows: Vec<Vec<String>> = c
            .generations
            .iter()
            .map(|g| {
                let seqs = g
                    .seqs
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(",");
                let mut flags = Vec::new();
                if g.is_head {
                    flags.push("head".to_owned());
                }
                if g.pinned {
                    flags.push("pinned".to_owned());
                }
                match &g.state {
                    ManifestState::Present(s) => vec![
                        short(&g.id),
                        seqs,
                        s.file_count.to_string(),
                        bytesize::ByteSize(s.size_bytes).to_string(),
                        s.packs.len().to_string(),
                        age(s.created_at),
                        flags.join(" "),
                    ],
                    ManifestState::Missing | ManifestState::Corrupt { .. } => {
                        flags.push(
                            if matches!(g.state, ManifestState::Missing) {
                                "manifest-missing"
                            } else {
                                "manifest-corrupt"
                            }
                            .to_owned(),
                        );
                        vec![
                            short(&g.id),
                            seqs,
                            "-".into(),
                            "-".into(),
                            "-".into(),
                            age(g.head_written_at),
                            flags.join(" "),
                        ]
                    }
                }
            })
            .collect();
        table(
            &["  GENERATION", "HEAD", "FILES", "SIZE", "PACKS", "AGE", ""],
            &rows
                .into_iter()
                .map(|mut r| {
                    r[0] = format!("  {}", r[0]);
                    r
                })
                .collect::<Vec<_>>(),
        );
    }
    Ok(0)
}

fn run_inspect(args: InspectArgs) -> Result<i32> {
    let session = Session::open_store(&args.common.settings)?;
    let id = resolve_generation(&session, &args.generation)?;
    let mut i = inspect::inspect(session.store.as_ref(), &session.layout, &id)?;
    if !args.files {
        i.files.clear();
    }
    if args.common.json {
        println!("{}", serde_json::to_string_pretty(&i)?);
        return Ok(0);
    }
    println!("generation  {}", i.id);
    println!("cache       {} (compat id {})", i.cache_kind, i.compat_id);
    println!("compat key  {}", i.compat_key);
    println!(
        "created     {} ago by {}{} (jitship {})",
        age(i.created_at),
        i.producer.host,
        i.producer
            .pod
            .as_ref()
            .map(|p| format!(", pod {p}"))
            .unwrap_or_default(),
        i.producer.jitship_version
    );
    println!(
        "policy      {} {} ({})",
        i.policy.name, i.policy.version, i.policy.digest
    );
    println!(
        "content     {} files, {}, in {} packs ({})",
        i.file_count,
        bytesize::ByteSize(i.size_bytes),
        i.pack_count,
        bytesize::ByteSize(i.packed_bytes)
    );
    let heads = if i.heads.is_empty() {
        "none (not reachable from a head)".to_owned()
    } else {
        format!(
            "{}{}",
            i.heads
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            if i.is_head { " (the newest)" } else { "" }
        )
    };
    println!("heads       {heads}");
    match &i.pinned {
        Some(p) => println!(
            "pinned      {} ago by {}{}",
            age(p.pinned_at),
            p.by,
            p.reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
        None => println!("pinned      no"),
    }
    println!("facts");
    for (k, v) in &i.facts {
        println!("  {k} = {v}");
    }
    if !i.merged.is_empty() {
        println!("merged (publishers that lost a head race)");
        for m in &i.merged {
            println!("  {m}");
        }
    }
    println!("parent chain");
    if i.parent_chain.is_empty() {
        println!("  (none: first generation of its chain)");
    }
    for link in &i.parent_chain {
        match (link.created_at, link.file_count) {
            (Some(c), Some(n)) => println!("  {}  {n} files, {} ago", link.id, age(c)),
            _ => println!("  {}  (manifest gone: collected or evicted)", link.id),
        }
    }
    if args.files {
        println!("files");
        for f in &i.files {
            println!(
                "  {}  {:>10}  {}",
                short(&f.blake3),
                bytesize::ByteSize(f.size).to_string(),
                f.path
            );
        }
    }
    Ok(0)
}

fn run_verify(args: VerifyArgs) -> Result<i32> {
    let session = Session::open_store(&args.common.settings)?;
    let store = session.store.as_ref();
    let ids: Vec<GenerationId> = match &args.generation {
        Some(g) => vec![resolve_generation(&session, g)?],
        None => {
            let survey = inspect::survey(store, &session.layout)?;
            let mut ids: Vec<GenerationId> = survey.generations().map(|(_, g)| g.id).collect();
            ids.dedup();
            ids
        }
    };
    let mut results = Vec::new();
    for id in &ids {
        let bar = spinner(format!("verifying {}", short(id)));
        let v = inspect::verify(store, &session.layout, id);
        bar.finish_and_clear();
        let v = v.with_context(|| format!("verifying {id}"))?;
        if !args.common.json {
            if v.ok {
                println!(
                    "{}: ok ({} files, {} packs, {})",
                    v.generation,
                    v.files_checked,
                    v.packs_fetched,
                    bytesize::ByteSize(v.bytes_fetched)
                );
            } else {
                println!("{}: {} problem(s)", v.generation, v.problems.len());
                for p in &v.problems {
                    println!("  {p}");
                }
            }
        }
        results.push(v);
    }
    if args.common.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else if ids.is_empty() {
        println!("no generations to verify");
    }
    Ok(if results.iter().all(|v| v.ok) { 0 } else { 3 })
}

fn run_pin(args: PinArgs, pin: bool) -> Result<i32> {
    let session = Session::open_store(&args.common.settings)?;
    let store = session.store.as_ref();
    let id = resolve_generation(&session, &args.generation)?;
    if pin {
        if crate::catalog::fetch_manifest(store, &session.layout, &id)?.is_none() {
            bail!(
                "generation {id} is not in the store (collected or evicted); run `jitship ls` to see what is"
            );
        }
        let record = crate::catalog::pin(store, &session.layout, &id, args.reason.clone())?;
        if args.common.json {
            println!("{}", serde_json::to_string_pretty(&record)?);
        } else {
            println!("pinned {id}: gc will not drop it until `jitship unpin`");
        }
    } else {
        let removed = crate::catalog::unpin(store, &session.layout, &id)?;
        if args.common.json {
            println!(
                "{}",
                serde_json::json!({ "generation": id, "was_pinned": removed })
            );
        } else if removed {
            println!("unpinned {id}: retention applies to it again");
        } else {
            println!("{id} was not pinned");
        }
    }
    Ok(0)
}

fn run_gc(args: GcArgs) -> Result<i32> {
    let session = Session::open_store(&args.common.settings)?;
    let retention = &session.config.retention;
    let mut limits = retention.limits();
    if let Some(n) = args.keep {
        if n == 0 {
            bail!("--keep must be at least 1 (the newest generation is always kept)");
        }
        limits.max_generations = Some(n);
    }
    if let Some(b) = args.max_bytes {
        limits.max_bytes = Some(b.as_u64());
    }
    if let Some(a) = args.max_age {
        limits.max_age_secs = Some(a.as_secs());
    }
    let opts = crate::gc::GcOptions {
        now: now(),
        grace: args.grace.unwrap_or(retention.grace),
        limits,
        dry_run: args.dry_run,
        lease_wait: retention.lease_wait,
        lease_rounds: crate::gc::GcOptions::DEFAULT_LEASE_ROUNDS,
    };
    let policy_for = |kind: &str| session.policy_for_kind(kind);
    let report = crate::gc::collect(session.store.as_ref(), &session.layout, &policy_for, &opts)
        .with_context(|| format!("gc of {}", session.store.describe()))?;
    if args.common.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let rows: Vec<Vec<String>> = report
            .decisions
            .iter()
            .map(|d| {
                vec![
                    d.cache_kind.clone().unwrap_or_else(|| "?".into()),
                    short(&d.generation),
                    serde_json::to_value(d.verdict)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    bytesize::ByteSize(d.size_bytes).to_string(),
                    d.reason.clone(),
                ]
            })
            .collect();
        if !rows.is_empty() {
            table(&["KIND", "GENERATION", "VERDICT", "SIZE", "WHY"], &rows);
        }
        for e in &report.policy_errors {
            println!("policy error: {e}");
        }
        let verb = if report.dry_run {
            "would remove"
        } else {
            "removed"
        };
        println!(
            "{verb} {} head records, {} manifests, {} packs ({}); {} packs kept because a retained generation shares them",
            report.heads.len(),
            report.manifests.len(),
            report.packs.len(),
            bytesize::ByteSize(report.pack_bytes),
            report.packs_shared
        );
        if report.dry_run {
            for h in &report.heads {
                println!("  head      {h}");
            }
            for m in &report.manifests {
                println!("  manifest  {m}");
            }
            for p in &report.packs {
                println!("  pack      {p}");
            }
        }
        if let Some(j) = report.resumed_journal {
            println!("finished the interrupted gc run of journal {j}");
        }
        for e in &report.errors {
            println!("could not remove {e}");
        }
    }
    if !report.errors.is_empty() {
        eprintln!(
            "error: {} keys could not be removed; run gc again (it resumes from its journal)",
            report.errors.len()
        );
        return Ok(1);
    }
    Ok(0)
}

fn run_policy(cmd: PolicyCommand) -> Result<i32> {
    match cmd {
        PolicyCommand::Build(args) => run_policy_build(args),
        PolicyCommand::Check(args) => run_policy_check(args),
        PolicyCommand::Test(args) => run_policy_test(args),
    }
}

fn run_policy_build(args: PolicyBuildArgs) -> Result<i32> {
    use crate::policy::build::{BuildOptions, build_policy_crate, write_component};
    let opts = BuildOptions {
        target_dir: args.target_dir.clone(),
        quiet: false,
        locked: args.locked,
    };
    let built = build_policy_crate(&args.path, &opts)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}.wasm", built.name)));
    write_component(&out, &built.component)?;
    for w in &built.warnings {
        eprintln!("warning: {w}");
    }
    if args.json {
        let report = serde_json::json!({
            "name": built.name,
            "path": out,
            "digest": built.digest,
            "core_size": built.core_size,
            "component_size": built.component.len(),
            "warnings": built.warnings,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "built {} ({}; core module {}) blake3 {}",
            out.display(),
            bytesize::ByteSize(built.component.len() as u64),
            bytesize::ByteSize(built.core_size),
            built.digest
        );
        println!("  check it: jitship policy check {}", out.display());
    }
    Ok(0)
}

impl PolicySandboxArgs {
    fn engine(&self) -> Result<Arc<crate::policy::host::PolicyEngine>> {
        let mut config = match &self.config {
            Some(path) => Config::load(path)?,
            // An author's one-shot run: compiling (~0.1 s) beats touching a system cache directory.
            None => Config {
                policy: crate::config::PolicyConfig {
                    compile_cache: false,
                    ..Default::default()
                },
                ..Config::default()
            },
        };
        if self.no_compile_cache {
            config.policy.compile_cache = false;
        }
        Ok(crate::policy::host::PolicyEngine::new(&config.policy)?)
    }
}

fn run_policy_check(args: PolicyCheckArgs) -> Result<i32> {
    let engine = args.sandbox.engine()?;
    let report = match crate::author::check(&engine, &args.file) {
        Ok(r) => r,
        Err(e) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({ "path": args.file, "error": e.to_string() })
                );
            } else {
                eprintln!("{}: refused: {e}", args.file.display());
            }
            return Ok(1);
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    let i = &report.info;
    println!("{}: ok", report.path.display());
    println!(
        "  policy      {} {} for cache kind {:?}",
        i.name, i.version, i.cache_kind
    );
    println!("  contract    jitship:policy@{}", report.contract);
    println!(
        "  module      {} blake3 {}",
        bytesize::ByteSize(report.size_bytes),
        report.digest
    );
    if !i.description.is_empty() {
        println!("  description {}", i.description);
    }
    println!(
        "  root        {} (moved by: {})",
        i.default_root,
        if i.root_env.is_empty() {
            "-".to_string()
        } else {
            i.root_env.join(", ")
        }
    );
    println!(
        "  reads files {}",
        if report.reads_files {
            "yes (read-file, inside the root only)"
        } else {
            "no"
        }
    );
    println!("  imports");
    for import in &report.imports {
        println!("    {import}");
    }
    println!("  exports     {}", report.exports.join(", "));
    println!(
        "  load        {} µs ({})",
        report.load.total_us,
        if report.load.from_cache {
            "compiled-module cache hit"
        } else {
            "compiled"
        }
    );
    Ok(0)
}

fn run_policy_test(args: PolicyTestArgs) -> Result<i32> {
    let engine = args.sandbox.engine()?;
    let policy = match engine.load_file(&args.file) {
        Ok(p) => p,
        Err(e) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({ "path": args.file, "error": e.to_string() })
                );
            } else {
                eprintln!("{}: refused: {e}", args.file.display());
            }
            return Ok(1);
        }
    };
    let mut facts = Facts::new();
    for arg in args.facts.iter().filter(|a| !a.trim().is_empty()) {
        let (k, v) = config::parse_fact_arg(arg.trim())?;
        facts.set(k, v);
    }
    let generations = match &args.generations {
        Some(path) => Some(crate::author::read_generations(path)?),
        None => None,
    };
    let now = args.now.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    });
    let input = crate::author::TestInput {
        facts,
        root: args.root.clone(),
        generations,
        now,
        limits: crate::policy::RetentionLimits {
            max_generations: args.max_generations,
            max_bytes: args.max_bytes.map(|b| b.as_u64()),
            max_age_secs: args.max_age.map(|d| d.as_secs()),
        },
    };
    let report = crate::author::test(&policy, &input)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_policy_test(&report);
    }
    Ok(if report.all_ok() { 0 } else { 1 })
}

fn print_call_cost<T>(call: &crate::author::Call<T>) -> String {
    match (call.fuel_used, call.wall_us) {
        (Some(fuel), Some(us)) => format!("(fuel {fuel}, {:.2} ms)", us as f64 / 1000.0),
        _ => String::new(),
    }
}

fn print_policy_logs<T>(call: &crate::author::Call<T>) {
    for l in &call.logs {
        println!("    log [{}] {}", l.level, l.message);
    }
}

fn print_policy_test(r: &crate::author::TestReport) {
    println!(
        "policy {} {} (cache kind {:?}, contract {}, blake3 {})",
        r.policy.name, r.policy.version, r.policy.cache_kind, r.contract, r.digest
    );
    match (&r.compat_key.value, &r.compat_key.error) {
        (Some(key), _) => {
            println!("compat key: {key} {}", print_call_cost(&r.compat_key));
            if let Some(id) = &r.compat_id {
                println!("  compat id {id}");
            }
        }
        (None, Some(e)) => println!(
            "compat key: REFUSED: {e} {}",
            print_call_cost(&r.compat_key)
        ),
        (None, None) => {}
    }
    print_policy_logs(&r.compat_key);
    if let Some(s) = &r.select {
        match &s.call.error {
            Some(e) => println!(
                "select on {}: FAILED: {e} {}",
                s.root.display(),
                print_call_cost(&s.call)
            ),
            None => println!(
                "select on {}: {} to publish ({}), {} skipped {}",
                s.root.display(),
                s.publish_files,
                bytesize::ByteSize(s.publish_bytes),
                s.skip_files,
                print_call_cost(&s.call)
            ),
        }
        for d in s.call.value.iter().flatten() {
            let verdict = match d.verdict {
                crate::policy::Verdict::Publish => "publish",
                crate::policy::Verdict::Skip => "skip   ",
            };
            println!("  {verdict} {}  ({})", d.path, d.reason);
        }
        for (path, why) in &s.never_offered {
            println!("  never   {path}  ({why}; not offered to the policy)");
        }
        print_policy_logs(&s.call);
    }
    if let Some(t) = &r.retain {
        match (&t.call.value, &t.call.error) {
            (Some(drop), _) => {
                println!(
                    "retain over {} generations: drop {}, keep {} {}",
                    t.generations,
                    drop.len(),
                    t.keep.len(),
                    print_call_cost(&t.call)
                );
                for id in drop {
                    println!("  drop {id}");
                }
                for id in &t.keep {
                    println!("  keep {id}");
                }
            }
            (None, Some(e)) => println!("retain: FAILED: {e} {}", print_call_cost(&t.call)),
            (None, None) => {}
        }
        print_policy_logs(&t.call);
    }
}
