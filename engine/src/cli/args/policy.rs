//! The policy author's commands (`policy build|check|test|new`) and `key`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::ConfigArg;
use crate::cli::exit;

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
    #[command(flatten)]
    pub config: ConfigArg,

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
