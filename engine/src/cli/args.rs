//! The command-line definitions (clap) and how flags, JITSHIP_* env and the config file resolve
//! into one `Config`.
//!
//! Declarations, nearly all of it: the clap definitions of every command and option group,
//! with their help text; the logic is the short resolution of flags, env and file at the end.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};

use super::exit;
use crate::config::{self, Config, ScopedFacts};

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

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Make an ed25519 key pair: the private key goes to --out (PKCS#8 PEM, created 0600, never
    /// overwritten, never printed), the public key to --out.pub and stdout. Give the private key
    /// to publishers (trust.signing_key_file, --signing-key, JITSHIP_SIGNING_KEY_FILE) and the
    /// public key to every host that installs (trust.trusted_keys).
    #[command(after_help = exit::SIMPLE_HELP)]
    Generate(KeyGenerateArgs),
    /// Print the public key and key id of a private key file (for rotations and audits).
    #[command(after_help = exit::SIMPLE_HELP)]
    Public(KeyPublicArgs),
}

#[derive(Debug, Args)]
pub struct KeyGenerateArgs {
    /// Where to write the private key.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,

    /// Where to write the public key [default: FILE.pub].
    #[arg(long, value_name = "FILE")]
    pub public_out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct KeyPublicArgs {
    /// The private key file.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Build a policy crate into a component jitship loads: cargo build for
    /// wasm32-unknown-unknown (profile `policy`: small, reproducible), then componentize in-process.
    /// Needs `rustup target add wasm32-unknown-unknown`; nothing else.
    #[command(after_help = exit::SIMPLE_HELP)]
    Build(PolicyBuildArgs),
    /// Load a policy module the way jitship would and show what it is: contract version, info(),
    /// imports (capabilities) and exports. Exits 1, with the reason, if jitship would refuse it.
    #[command(after_help = exit::POLICY_CHECK_HELP)]
    Check(PolicyCheckArgs),
    /// Dry-run a policy: its compatibility key for the given facts (or its refusal), its publish/skip
    /// decisions with reasons for a cache root, and its retention decisions for a list of
    /// generations. Nothing is published. Exits 1 if any call failed or refused.
    #[command(after_help = exit::POLICY_TEST_HELP)]
    Test(PolicyTestArgs),
    /// Start a new policy crate: Cargo.toml, src/lib.rs (key, select and retention for the kind,
    /// with native tests), README.md, and the SDK of this jitship in sdk/ (a path dependency, so it
    /// builds anywhere). Builds with `jitship policy build` as written.
    #[command(after_help = exit::SIMPLE_HELP)]
    New(PolicyNewArgs),
}

#[derive(Debug, Args)]
pub struct PolicyNewArgs {
    /// The crate's name (and the policy's name): letters, digits, - and _.
    #[arg(value_name = "NAME")]
    pub name: String,

    /// The cache kind the policy governs (default: NAME).
    #[arg(long, value_name = "KIND")]
    pub kind: Option<String>,

    /// Where to write the crate (default: ./NAME); refused if it exists and is not empty.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Print {dir, name, kind, crate_name, sdk_version, files} as JSON on stdout.
    #[arg(long)]
    pub json: bool,
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

    /// A setting the policy declares, as NAME=VALUE (repeatable), read by its kind (keep=2,
    /// max_age=1h, quota=20GiB); the rest take their defaults. The policy checks them
    /// (`check-settings`) before anything else runs.
    #[arg(long = "setting", value_name = "NAME=VALUE")]
    pub settings: Vec<String>,

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

    /// A setting the policy declares, as NAME=VALUE (repeatable), read by its kind (keep=2,
    /// max_age=1h, quota=20GiB); the rest take their defaults. The policy checks them
    /// (`check-settings`) before anything else runs.
    #[arg(long = "setting", value_name = "NAME=VALUE")]
    pub settings: Vec<String>,

    /// A cache root to run select on (scanned as publish scans it).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,

    /// A fact as NAME=VALUE (repeatable). Only these facts are given to the policy.
    #[arg(long = "fact", value_name = "NAME=VALUE")]
    pub facts: Vec<String>,

    /// A JSON list of generations, newest first, to run retain on: [{"id", "compat_key",
    /// "created_at", "size_bytes", "file_count", "pinned"}]. Each "id" is a generation id: 64
    /// lowercase hex digits, as `jitship ls` prints them (for a dry run any distinct 64-hex strings
    /// do; short ids are refused, never padded). "created_at" is Unix seconds, "pinned" optional.
    /// Jitship checks the file before the policy sees it; its refusals say "jitship rejected FILE",
    /// the entry and why, while the policy's own say "policy rejected its input".
    #[arg(long, value_name = "FILE.json")]
    pub generations: Option<PathBuf>,

    /// "Now" for retain, so ages need no faking: Unix seconds (1714564800) or an RFC 3339 time
    /// (2024-05-01T12:00:00Z, 2024-05-01T14:00:00+02:00). Default: the current time.
    #[arg(long, value_name = "SECS|RFC3339", value_parser = crate::author::parse_now)]
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

/// Where the store is, whom it trusts, plus `--json`, for the store commands (they key no caches:
/// no --cache, no --fact).
#[derive(Debug, Args)]
pub struct OperatorArgs {
    #[command(flatten)]
    pub store: StoreArgs,

    /// Print the JSON envelope on stdout (for scripts) instead of tables.
    #[arg(long, help_heading = "Output")]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub common: OperatorArgs,
}

/// `audit` needs no store and no facts: the caches (and the config file that may list them).
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// TOML config file: its [[cache]] entries and [policy] settings.
    #[arg(long, env = "JITSHIP_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// The engine whose caches to audit, as install resolved them (`vllm`, `sglang`): each of
    /// its roots that holds an install record.
    #[arg(long, env = "JITSHIP_ENGINE", value_name = "ENGINE")]
    pub engine: Option<config::Engine>,

    /// A cache to audit as KIND[:POLICY][=ROOT] (repeatable; env: comma-separated), resolved as
    /// install resolves it (without =ROOT: the engine's own root from this environment).
    #[arg(
        long = "cache",
        env = "JITSHIP_CACHES",
        value_name = "KIND[:POLICY][=ROOT]",
        value_delimiter = ','
    )]
    pub caches: Vec<String>,

    /// Print the JSON envelope on stdout (for scripts) instead of the summary.
    #[arg(long, help_heading = "Output")]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Generation id (64 hex digits, or a unique prefix of at least 8 as `ls` prints).
    pub generation: String,

    /// Also list every file.
    #[arg(long)]
    pub files: bool,

    /// Write the policy module the generation was published with to FILE (built in, or fetched
    /// from the store and checked against its digest), e.g. for `policy test FILE`.
    #[arg(long, value_name = "FILE.wasm")]
    pub save_module: Option<PathBuf>,

    #[command(flatten)]
    pub common: OperatorArgs,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Generation id or unique prefix; all generations when omitted.
    pub generation: Option<String>,

    /// Remove the packs found damaged (wrong size, or bytes that do not hash to the manifest's),
    /// so the next publish uploads them again; installs fall back to older generations meanwhile.
    /// With a durable tier, first fill each tier from the other with what checks (packs, manifest,
    /// then heads; generations the trust admits only); what both hold damaged is removed.
    #[arg(long)]
    pub repair: bool,

    /// Scrub instead: read N packs picked at random among those the kept generations name, check
    /// them against their manifests and (with --repair) put back from the durable tier what the
    /// fast tier lost or damaged; exit 3 when something is still wrong.
    #[arg(long, value_name = "N", conflicts_with = "generation")]
    pub sample: Option<usize>,

    #[command(flatten)]
    pub common: OperatorArgs,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The layout directory to write (created; must be absent or empty), or FILE.tar: the
    /// layout as one tar archive (must not exist).
    #[arg(long, value_name = "DIR|FILE.tar")]
    pub out: PathBuf,

    /// A compat id to export (repeatable; all of the store's when omitted).
    #[arg(long = "compat-id", value_name = "ID")]
    pub compat_ids: Vec<String>,

    #[command(flatten)]
    pub common: OperatorArgs,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The layout directory `jitship export` wrote, or its tar archive (a file).
    #[arg(long, value_name = "DIR|FILE.tar")]
    pub from: PathBuf,

    #[command(flatten)]
    pub common: OperatorArgs,
}

#[derive(Debug, Args)]
pub struct PinArgs {
    /// Generation id or unique prefix.
    pub generation: String,

    /// Why (recorded in the pin, shown by `inspect`).
    #[arg(long)]
    pub reason: Option<String>,

    #[command(flatten)]
    pub common: OperatorArgs,
}

#[derive(Debug, Args)]
pub struct UnpinArgs {
    /// Generation id or unique prefix.
    pub generation: String,

    #[command(flatten)]
    pub common: OperatorArgs,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    #[command(flatten)]
    pub common: OperatorArgs,

    /// Show what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// "Now" for a dry run, so retention by age and grace can be tried without waiting: Unix
    /// seconds or an RFC 3339 time (2024-05-01T12:00:00Z). Only with --dry-run: a real gc always
    /// decides at the current time.
    #[arg(long, value_name = "SECS|RFC3339", value_parser = crate::author::parse_now, requires = "dry_run")]
    pub now: Option<u64>,

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

    /// A cache whose policy module gc may use, KIND[:POLICY][=ROOT] (repeatable; env:
    /// comma-separated). Each compat key is decided by the policy it was published with, found by
    /// digest among the built-ins, these modules and --policy-dir; never by another rule.
    #[arg(
        long = "cache",
        env = "JITSHIP_CACHES",
        value_name = "KIND[:POLICY][=ROOT]",
        value_delimiter = ','
    )]
    pub caches: Vec<String>,

    /// A directory of policy modules (*.wasm) for keys published with a third-party policy
    /// (overrides [policy] modules_dir). A key whose policy gc does not have is kept whole.
    #[arg(long, env = "JITSHIP_POLICY_DIR", value_name = "DIR")]
    pub policy_dir: Option<PathBuf>,

    /// Refused with the reason: gc decides each key with the settings its newest generation
    /// recorded (change them with `publish --setting`), never with settings given to gc.
    #[arg(long, hide = true, value_name = "KIND:NAME=VALUE")]
    pub setting: Vec<String>,
}

/// Where the store is (and the config file that may say so).
#[derive(Debug, Args)]
#[command(next_help_heading = "Store")]
pub struct StoreArgs {
    /// TOML config file (see examples/jitship.toml).
    #[arg(long, env = "JITSHIP_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

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

    /// A cache as KIND[:POLICY][=ROOT] (repeatable; env: comma-separated); overrides the config's
    /// entry for that kind. Without =ROOT the root is the one the engine would use, from this
    /// process's environment (e.g. inductor: $TORCHINDUCTOR_CACHE_DIR, else
    /// $TMPDIR/torchinductor_$USER). POLICY: a policy module FILE.wasm, or `native` for jitship's
    /// generic rules (required for a kind with no built-in policy).
    #[arg(
        long = "cache",
        env = "JITSHIP_CACHES",
        value_name = "KIND[:POLICY][=ROOT]",
        value_delimiter = ',',
        help_heading = "Caches and facts"
    )]
    pub caches: Vec<String>,

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

    /// A fact as NAME=VALUE, or KIND:NAME=VALUE for the cache of that kind only (repeatable): the
    /// value is everything after the first '=', ';' and '=' included. Precedence, lowest first:
    /// gathered, the config's [facts], its [[cache]] facts, NAME=VALUE, KIND:NAME=VALUE. Without
    /// --fact: env JITSHIP_FACTS, a semicolon-separated list of the same forms (there a value
    /// cannot hold ';').
    #[arg(
        long = "fact",
        value_name = "[KIND:]NAME=VALUE",
        help_heading = "Caches and facts"
    )]
    pub facts: Vec<String>,

    /// A setting of a cache's policy as KIND:NAME=VALUE (repeatable); wins over the config's
    /// `[[cache]] settings`. Only settings the policy declares (`jitship policy check FILE`
    /// lists them), read by their kinds: keep=2, max_age=1h, quota=20GiB.
    #[arg(
        long = "setting",
        value_name = "KIND:NAME=VALUE",
        help_heading = "Caches and facts"
    )]
    pub settings: Vec<String>,

    /// `JITSHIP_FACTS`, read only when no `--fact` is given (see [`fact_overrides`]).
    #[arg(long = "fact-list", env = "JITSHIP_FACTS", hide = true)]
    pub fact_list: Option<String>,

    /// The inference engine's Python interpreter, which python.* and pkg.* facts are gathered
    /// from (default: [gather] python, then $VIRTUAL_ENV/bin/python3, then python3 on PATH). The
    /// same for every command.
    #[arg(
        long,
        env = "JITSHIP_PYTHON",
        value_name = "PATH",
        help_heading = "Caches and facts"
    )]
    pub python: Option<PathBuf>,

    /// Private key that signs the heads this host publishes (overrides trust.signing_key_file).
    #[arg(
        long,
        env = "JITSHIP_SIGNING_KEY_FILE",
        value_name = "FILE",
        help_heading = "Trust"
    )]
    pub signing_key: Option<PathBuf>,
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

    /// Print the JSON envelope (every cache, published or failed, and the errors) on stdout.
    #[arg(long, help_heading = "Output")]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    #[command(flatten)]
    pub settings: SettingsArgs,

    /// Bound on the whole install, e.g. "60s"; past it the roots are left as they were.
    #[arg(long, env = "JITSHIP_DEADLINE", value_parser = humantime::parse_duration)]
    pub deadline: Option<Duration>,

    /// Write the JSON envelope to FILE (always: also when the store or the config failed).
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    pub report: Option<PathBuf>,

    /// Print the JSON envelope on stdout instead of the summary.
    #[arg(long, help_heading = "Output")]
    pub json: bool,

    /// Exit 0 whatever the outcome, configuration errors included (for init containers that must
    /// never block a pod); the report still tells the truth.
    #[arg(long, env = "JITSHIP_BEST_EFFORT")]
    pub best_effort: bool,

    /// Test hook: pause this long before each file moved into a root, so the test suite can
    /// SIGKILL an install mid-commit. Not for production use.
    #[arg(long, hide = true, value_parser = humantime::parse_duration)]
    pub test_commit_pause: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub settings: SettingsArgs,

    #[command(flatten)]
    pub flags: WatchFlags,
}

/// How the watcher publishes (`watch`, and `run` beside its server).
#[derive(Debug, Args)]
pub struct WatchFlags {
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

    /// Scrub the store this often (sampled packs re-read, checked, repaired from the durable
    /// tier), e.g. 1h; 0s never [default: 0s].
    #[arg(long, env = "JITSHIP_SCRUB_INTERVAL", value_parser = humantime::parse_duration)]
    pub scrub_interval: Option<Duration>,

    /// Packs one scrub reads [default: 16].
    #[arg(long, env = "JITSHIP_SCRUB_SAMPLE", value_name = "N")]
    pub scrub_sample: Option<usize>,

    /// Largest pack object, e.g. "64 MiB".
    #[arg(long, env = "JITSHIP_PACK_SIZE")]
    pub pack_size: Option<bytesize::ByteSize>,

    /// Pod name recorded as the producer.
    #[arg(long, env = "POD_NAME")]
    pub pod: Option<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub settings: SettingsArgs,

    /// Bound on the install before the server starts, e.g. "60s" (counted from jitship's start);
    /// past it the roots are left as they were and the server starts anyway.
    #[arg(long, env = "JITSHIP_DEADLINE", value_parser = humantime::parse_duration)]
    pub deadline: Option<Duration>,

    /// Write the install's JSON envelope to FILE (as `install --report`).
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    pub report: Option<PathBuf>,

    #[command(flatten)]
    pub watch: WatchFlags,

    /// Publish only when the server exits (or on SIGTERM/SIGINT), never while it runs: for a
    /// server with no health URL (wins over --ready-url). The default without --ready-url,
    /// [watch] ready_url or --engine.
    #[arg(long)]
    pub publish_on_exit: bool,

    /// After the server exited and the final publish: run `jitship audit` on the caches (did the
    /// server compile anything the install should have given it?). Its result is printed; the
    /// exit status stays the server's.
    #[arg(long)]
    pub audit: bool,

    /// The server and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "SERVER ARGS")]
    pub server: Vec<std::ffi::OsString>,
}

#[derive(Debug, Args)]
pub struct FactsArgs {
    /// TOML config file: its [facts] overrides and [gather] settings.
    #[arg(long, env = "JITSHIP_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// A fact as NAME=VALUE, or KIND:NAME=VALUE for the cache of that kind only (repeatable): the
    /// value is everything after the first '=', ';' and '=' included. Precedence, lowest first:
    /// gathered, the config's [facts], its [[cache]] facts, NAME=VALUE, KIND:NAME=VALUE. Without
    /// --fact: env JITSHIP_FACTS, a semicolon-separated list of the same forms (there a value
    /// cannot hold ';').
    #[arg(long = "fact", value_name = "[KIND:]NAME=VALUE")]
    pub facts: Vec<String>,

    /// `JITSHIP_FACTS`, read only when no `--fact` is given (see [`fact_overrides`]).
    #[arg(long = "fact-list", env = "JITSHIP_FACTS", hide = true)]
    pub fact_list: Option<String>,

    /// The inference engine's Python interpreter (default: [gather] python, then
    /// $VIRTUAL_ENV/bin/python3, then python3 on PATH).
    #[arg(long, env = "JITSHIP_PYTHON", value_name = "PATH")]
    pub python: Option<PathBuf>,

    /// Caches whose roots to show as publish and install would resolve them, as
    /// KIND[:POLICY][=ROOT] (repeatable; env: comma-separated); the config's [[cache]] too.
    #[arg(
        long = "cache",
        env = "JITSHIP_CACHES",
        value_name = "KIND[:POLICY][=ROOT]",
        value_delimiter = ','
    )]
    pub caches: Vec<String>,

    /// The engine whose caches to show (`vllm`, `sglang`): those it reads here, as publish and
    /// install choose them, with why.
    #[arg(long, env = "JITSHIP_ENGINE", value_name = "ENGINE")]
    pub engine: Option<config::Engine>,

    /// Print {"facts", "sources", "missing", "roots"} as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

impl StoreArgs {
    /// The configuration file with the store and trust flags on top (not validated).
    fn load(&self) -> Result<Config> {
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
        if let Some(durable) = &self.durable_store {
            config::apply_durable_store_arg(&mut config.store, durable)?;
        }
        config.trust.trusted_keys.extend(
            self.trust
                .trusted_keys
                .iter()
                .filter(|k| !k.trim().is_empty())
                .map(|k| k.trim().to_owned()),
        );
        if let Some(mode) = self.trust.trust_mode {
            config.trust.mode = Some(mode);
        }
        Ok(config)
    }

    /// The effective configuration for a store command.
    pub fn resolve(&self) -> Result<Config> {
        let config = self.load()?;
        config.validate()?;
        Ok(config)
    }
}

impl SettingsArgs {
    /// The effective configuration: config file, then env and flags on top.
    pub fn resolve(&self) -> Result<Config> {
        let mut config = self.store.load()?;
        config::apply_cache_args(&mut config, &self.caches)?;
        if self.engine.is_some() {
            config.engine = self.engine;
        }
        config.add_engine_candidates();
        if let Some(python) = &self.python {
            config.gather.python = Some(python.clone());
        }
        config.flag_facts = fact_overrides(&self.facts, self.fact_list.as_deref())?;
        for setting in &self.settings {
            config::apply_setting_arg(&mut config, setting)?;
        }
        if let Some(path) = &self.signing_key {
            config.trust.signing_key_file = Some(path.clone());
        }
        config.validate()?;
        Ok(config)
    }
}

/// `--setting NAME=VALUE` flags of `policy check` and `policy test`, by name (a later one wins).
pub fn policy_settings(flags: &[String]) -> Result<std::collections::BTreeMap<String, String>> {
    flags
        .iter()
        .map(|f| Ok(config::parse_setting_arg(f)?))
        .collect()
}

impl FactsArgs {
    /// The `--fact` / `JITSHIP_FACTS` overrides (see [`fact_overrides`]).
    pub fn fact_overrides(&self) -> Result<ScopedFacts> {
        fact_overrides(&self.facts, self.fact_list.as_deref())
    }
}

/// The facts given on the command line: every `--fact [KIND:]NAME=VALUE` kept whole (only the
/// first `=` separates; a value may hold `;` and `=`, so one flag is always exactly one fact),
/// or, when no `--fact` is given, `JITSHIP_FACTS` parsed as a `[KIND:]NAME=VALUE;...` list
/// (`config::parse_fact_list`: a value there cannot hold `;`; give such a fact with `--fact` or
/// in the config). With `KIND:` a fact is for the cache of that kind only
/// (`config::parse_scoped_fact_arg`; `Config::validate` refuses a kind the command has no cache
/// of). The flags win over the variable as a whole, as clap's flags win over their variables;
/// among flags, a later one of the same name and scope wins.
pub fn fact_overrides(flags: &[String], env_list: Option<&str>) -> Result<ScopedFacts> {
    if flags.is_empty() {
        return Ok(config::parse_fact_list(env_list.unwrap_or(""))?);
    }
    let mut facts = ScopedFacts::default();
    for arg in flags {
        let (kind, name, value) = config::parse_scoped_fact_arg(arg)?;
        facts.insert(kind.as_deref(), name, value);
    }
    Ok(facts)
}

impl AuditArgs {
    /// The config file with the --cache flags on top.
    pub fn resolve(&self) -> Result<Config> {
        let mut config = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        config::apply_cache_args(&mut config, &self.caches)?;
        if self.engine.is_some() {
            config.engine = self.engine;
        }
        config.add_engine_candidates();
        config.validate()?;
        Ok(config)
    }
}
