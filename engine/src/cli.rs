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
use crate::generation::Producer;
use crate::install::{InstallOptions, InstallOutcome, InstallReport};
use crate::policy::CachePolicy;
use crate::policy::native::NativeRules;
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
    /// Print the facts compatibility keys are built from, where each came from, and why each
    /// missing one is missing.
    ///
    /// GPU and driver come from NVML (or nvidia-smi, or /proc/driver/nvidia/version), Python and
    /// package versions from a bare interpreter and site-packages metadata (no import of torch).
    /// Overrides win: the config's [facts], then --fact / JITSHIP_FACTS. A policy that needs a
    /// missing fact refuses to produce a key: give it with --fact NAME=VALUE.
    Facts(FactsArgs),
}

/// Where the store is, which caches, and the facts keys are built from.
#[derive(Debug, Args)]
pub struct SettingsArgs {
    /// TOML config file (see examples/jitship.toml).
    #[arg(long, env = "JITSHIP_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Store to use: local:DIR.
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
        Command::Facts(args) => run_facts(args),
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
}

impl Session {
    fn open(settings: &SettingsArgs) -> Result<Self> {
        let config = settings.resolve()?;
        if config.caches.is_empty() {
            bail!(
                "no cache roots configured: pass --cache KIND=ROOT (e.g. --cache triton=$HOME/.triton/cache) or add [[cache]] to the config file"
            );
        }
        let store = crate::store::open(&config.store)
            .with_context(|| format!("opening the {:?} store", config.store.backend))?;
        let layout = KeyLayout::new(&config.store.namespace)?;
        let mut facts = Facts::new();
        facts.merge(&config.facts);
        Ok(Self {
            config,
            store,
            layout,
            facts,
        })
    }

    fn policy(&self, cache: &CacheConfig) -> Box<dyn CachePolicy> {
        Box::new(NativeRules::new(&cache.kind))
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

fn run_publish(args: PublishArgs) -> Result<i32> {
    let session = Session::open(&args.settings)?;
    let opts = PublishOptions {
        pack_size: args
            .pack_size
            .unwrap_or(session.config.publish.pack_size)
            .as_u64(),
        producer: Producer {
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            pod: args
                .pod
                .clone()
                .or_else(|| session.config.publish.pod.clone()),
            jitship_version: env!("CARGO_PKG_VERSION").into(),
        },
        facts: session.facts.clone(),
        max_head_attempts: 16,
    };
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
            policy.as_ref(),
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
