//! The command-line definitions (clap): every command's options, with their help text.
//!
//! Declarations only, by command family (`worker`: the commands that work on caches; `store`: the
//! store commands; `policy`: the author's commands and `key`), over the option groups every family
//! shares, declared once here. How flags, JITSHIP_* variables and the config file combine into one
//! `Config` is decided in one place: [`resolve`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use super::exit;
use crate::config;

mod policy;
mod resolve;
mod store;
mod worker;

pub use policy::*;
pub(crate) use resolve::policy_settings;
pub use store::*;
pub use worker::*;

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

    /// Log format on stderr (json: one object per line, with the event's fields as fields).
    #[arg(
        long,
        global = true,
        env = "JITSHIP_LOG_FORMAT",
        default_value = "text",
        help_heading = "Logging"
    )]
    pub log_format: LogFormat,

    /// Colour on stderr: auto = only on a terminal and never when NO_COLOR is set.
    #[arg(
        long,
        global = true,
        env = "JITSHIP_COLOR",
        default_value = "auto",
        help_heading = "Logging"
    )]
    pub color: ColorChoice,

    /// More detail: every skip category with the policy's words per skipped file and the transfer
    /// figures in summaries, debug logs (-vv trace). RUST_LOG, when set, decides the logs.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, help_heading = "Logging")]
    pub verbose: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Publish each configured cache root as a new generation (only new files are uploaded).
    #[command(after_help = exit::PUBLISH_HELP)]
    Publish(PublishArgs),
    /// Install the newest matching generation into each configured cache root.
    ///
    /// Whatever happens to one cache (store unreachable, policy refused, missing fact) becomes that
    /// cache's `failed` report; --report FILE is written in every case.
    ///
    /// Nothing outside a root is ever written or removed: every operation goes through a
    /// descriptor of the root opened once and follows no link (a root that is itself a symlink is
    /// resolved once, at the start). A SIGKILL (which nothing can catch) can leave: some of the
    /// generation's files in the root, each complete and verified, with marker files (those an
    /// engine finds the others through) only once everything they mark is in; and a
    /// `.jitship-staging-*` directory beside the root. The next install removes the staging and
    /// completes the generation.
    #[command(after_help = exit::INSTALL_HELP)]
    Install(InstallArgs),
    /// Watch the cache roots and publish complete new work as it appears (the sidecar).
    ///
    /// A root is published once it has been quiet for the settle window, at most once per minimum
    /// interval, and (with --ready-url) only after the server answered 200 once. On SIGTERM or
    /// SIGINT every root is published once more within the grace period.
    #[command(after_help = exit::WATCH_HELP)]
    Watch(WatchArgs),
    /// Run a server with its caches: install, start SERVER as a child, publish beside it, and exit
    /// with its status.
    ///
    /// `jitship run [FLAGS] -- SERVER ARGS...` installs first (best effort, within --deadline: a
    /// failed install is reported and the server starts anyway), starts the server in its own
    /// process group, watches the cache roots as `watch` does and publishes once the server is
    /// ready (--ready-url; with --engine vllm or sglang by default its /health on 127.0.0.1 and
    /// the --port of its arguments; otherwise only at exit). SIGTERM, SIGINT and SIGHUP are
    /// forwarded to the server; SIGTERM or SIGINT, or the server's own exit, start the final
    /// publish (within --grace; a second signal cuts it short). docs/guide/run.md.
    #[command(after_help = exit::RUN_HELP)]
    Run(RunArgs),
    /// Print the facts compatibility keys are built from, where each came from, and why each
    /// missing one is missing.
    ///
    /// GPU and driver come from NVML (or nvidia-smi, or /proc/driver/nvidia/version), Python and
    /// package versions from a bare interpreter and site-packages metadata (no import of torch).
    /// Overrides win, lowest first: the config's [facts], its [[cache]] facts, --fact NAME=VALUE /
    /// JITSHIP_FACTS, --fact KIND:NAME=VALUE; each cache's own overrides are shown in a section of
    /// their own. A policy that needs a missing fact refuses to produce a key: give it with
    /// --fact NAME=VALUE.
    #[command(after_help = exit::SIMPLE_HELP)]
    Facts(FactsArgs),
    /// List compat keys and their generations: sizes, file counts, ages, pins.
    #[command(after_help = exit::SIMPLE_HELP)]
    Ls(LsArgs),
    /// Show one generation: manifest, facts, producer, parent chain.
    #[command(after_help = exit::SIMPLE_HELP)]
    Inspect(InspectArgs),
    /// Fetch and check every pack and every file hash of a generation (default: every generation
    /// `ls` shows), and who signed its heads (an untrusted head is a problem under trust mode warn
    /// or required). --repair removes the damaged packs it found, so the next publish uploads them
    /// again.
    #[command(after_help = exit::VERIFY_HELP)]
    Verify(VerifyArgs),
    /// Pin a generation: retention never drops it (until `unpin`).
    #[command(after_help = exit::SIMPLE_HELP)]
    Pin(PinArgs),
    /// Remove a pin.
    #[command(after_help = exit::SIMPLE_HELP)]
    Unpin(UnpinArgs),
    /// Apply retention: remove dropped generations, their heads and the packs nothing retained
    /// references. `--dry-run` shows what it would remove.
    #[command(after_help = exit::GC_HELP)]
    Gc(GcArgs),
    /// Write the newest trusted generation of each compat id (or those named) to an OCI image
    /// layout directory: for air-gapped clusters and for baking caches into images; standard OCI
    /// tools (oras, skopeo, crane) copy it to a registry.
    #[command(after_help = exit::SIMPLE_HELP)]
    Export(ExportArgs),
    /// Put the generations of an OCI image layout directory written by `jitship export` into the
    /// store, every blob verified (sha256 and blake3) before anything is written.
    #[command(after_help = exit::SIMPLE_HELP)]
    Import(ImportArgs),
    /// After the engine has run: did it use the installed cache? Compares each cache root with the
    /// record the last `jitship install` left beside it and counts what the engine added since:
    /// compiled kernels (`.so`), precompiled headers, new FX-graph/AOTAutograd entries (torch
    /// cache misses). Roots resolve as install resolves them; no store is needed.
    #[command(after_help = exit::AUDIT_HELP)]
    Audit(AuditArgs),
    /// Build, check and dry-run policy modules (for policy authors).
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Signing keys for generations (see [trust] in examples/jitship.toml).
    #[command(subcommand)]
    Key(KeyCommand),
    /// Print a shell completion script, e.g. `jitship completions bash > /etc/bash_completion.d/jitship`.
    #[command(after_help = exit::SIMPLE_HELP)]
    Completions(CompletionsArgs),
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    pub shell: clap_complete::Shell,
}

/// `--config`: the TOML config file (every command that reads one).
#[derive(Debug, Args)]
pub struct ConfigArg {
    /// TOML config file (see examples/jitship.toml); a flag or JITSHIP_* variable wins over it.
    #[arg(long, env = "JITSHIP_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// `--cache`: the caches a command works on, on top of the config's `[[cache]]` entries.
#[derive(Debug, Args)]
#[command(next_help_heading = "Caches and facts")]
pub struct CacheArgs {
    /// A cache as KIND[:POLICY][=ROOT] (repeatable; env: comma-separated); overrides the config's
    /// entry for that kind. Without =ROOT the root is the one the engine would use, from this
    /// process's environment (e.g. inductor: $TORCHINDUCTOR_CACHE_DIR, else
    /// $TMPDIR/torchinductor_$USER), never the config's. POLICY: a policy module FILE.wasm, or
    /// `native` for jitship's generic rules (required for a kind with no built-in policy).
    #[arg(
        long = "cache",
        env = "JITSHIP_CACHES",
        value_name = "KIND[:POLICY][=ROOT]",
        value_delimiter = ','
    )]
    pub caches: Vec<String>,
}

/// `--fact`, `JITSHIP_FACTS` and `--python`: what keys are built from.
#[derive(Debug, Args)]
#[command(next_help_heading = "Caches and facts")]
pub struct FactArgs {
    /// A fact as NAME=VALUE, or KIND:NAME=VALUE for the cache of that kind only (repeatable): the
    /// value is everything after the first '=', ';' and '=' included. Precedence, lowest first:
    /// gathered, the config's [facts], its [[cache]] facts, NAME=VALUE, KIND:NAME=VALUE. Without
    /// --fact: env JITSHIP_FACTS, a semicolon-separated list of the same forms (there a value
    /// cannot hold ';').
    #[arg(long = "fact", value_name = "[KIND:]NAME=VALUE")]
    pub facts: Vec<String>,

    /// `JITSHIP_FACTS`, read only when no `--fact` is given (see `resolve::fact_overrides`).
    #[arg(long = "fact-list", env = "JITSHIP_FACTS", hide = true)]
    pub fact_list: Option<String>,

    /// The inference engine's Python interpreter, which python.* and pkg.* facts are gathered
    /// from (default: [gather] python, then $VIRTUAL_ENV/bin/python3, then python3 on PATH). The
    /// same for every command.
    #[arg(long, env = "JITSHIP_PYTHON", value_name = "PATH")]
    pub python: Option<PathBuf>,
}

/// Where the store is (and the config file that may say so).
#[derive(Debug, Args)]
#[command(next_help_heading = "Store")]
pub struct StoreArgs {
    #[command(flatten)]
    pub config: ConfigArg,

    /// Store to use: local:DIR, mooncake (the [store.mooncake] settings) or mooncake:HOST:PORT.
    #[arg(long, env = "JITSHIP_STORE", value_name = "STORE")]
    pub store: Option<String>,

    /// Key namespace inside the store.
    #[arg(long, env = "JITSHIP_NAMESPACE")]
    pub namespace: Option<String>,

    /// A durable tier behind the store: local:DIR (a local or shared directory, written first),
    /// oci:HOST[:PORT]/REPOSITORY (an OCI registry, each generation pushed as an artifact once
    /// published) or oci+http:... (plain HTTP). Install reads it when the store has nothing to
    /// install (evicted, restarted master) and puts what it read back into the store.
    #[arg(
        long,
        env = "JITSHIP_DURABLE_STORE",
        value_name = "local:DIR|oci:HOST/REPO"
    )]
    pub durable_store: Option<String>,

    #[command(flatten)]
    pub trust: TrustArgs,
}

/// Which signatures this host trusts (every command that reads generations).
#[derive(Debug, Args)]
#[command(next_help_heading = "Trust")]
pub struct TrustArgs {
    /// A trusted public key, `ed25519:<hex>` (repeatable; env: comma-separated). Added to
    /// trust.trusted_keys.
    #[arg(
        long = "trusted-key",
        env = "JITSHIP_TRUSTED_KEYS",
        value_name = "KEY",
        value_delimiter = ','
    )]
    pub trusted_keys: Vec<String>,

    /// Trust mode (overrides trust.mode): required, warn or off.
    #[arg(long, env = "JITSHIP_TRUST_MODE", value_name = "MODE")]
    pub trust_mode: Option<config::TrustMode>,
}

/// Where the store is, which caches, and the facts keys are built from.
#[derive(Debug, Args)]
pub struct SettingsArgs {
    #[command(flatten)]
    pub store: StoreArgs,

    #[command(flatten)]
    pub caches: CacheArgs,

    /// The inference engine whose caches to work on, all at once: `vllm` (its compile cache, or
    /// the Inductor cache and precompiled header, by VLLM_USE_AOT_COMPILE and the machine; roots
    /// from VLLM_CACHE_ROOT, TMPDIR, TORCHINDUCTOR_CACHE_DIR as vLLM resolves them) or `sglang`
    /// (the caches it moves under SGLANG_CACHE_DIR and its own, by machine, as SGLang resolves
    /// them; keyed with pkg.sglang too). A --cache of one of its kinds wins.
    #[arg(
        long,
        env = "JITSHIP_ENGINE",
        value_name = "ENGINE",
        help_heading = "Caches and facts"
    )]
    pub engine: Option<config::Engine>,

    #[command(flatten)]
    pub facts: FactArgs,

    /// A setting of a cache's policy as KIND:NAME=VALUE (repeatable); wins over the config's
    /// `[[cache]] settings`. Only settings the policy declares (`jitship policy check FILE`
    /// lists them), read by their kinds: keep=2, max_age=1h, quota=20GiB.
    #[arg(
        long = "setting",
        value_name = "KIND:NAME=VALUE",
        help_heading = "Caches and facts"
    )]
    pub settings: Vec<String>,

    /// Private key that signs the heads this host publishes (overrides trust.signing_key_file).
    #[arg(
        long,
        env = "JITSHIP_SIGNING_KEY_FILE",
        value_name = "FILE",
        help_heading = "Trust"
    )]
    pub signing_key: Option<PathBuf>,
}
