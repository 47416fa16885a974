//! The store commands: `ls`, `inspect`, `verify`, `pin`, `unpin`, `gc`, `export`, `import`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{CacheArgs, StoreArgs};

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

    #[command(flatten)]
    pub caches: CacheArgs,

    /// A directory of policy modules (*.wasm) for keys published with a third-party policy
    /// (overrides [policy] modules_dir). A key whose policy gc does not have is kept whole.
    #[arg(long, env = "JITSHIP_POLICY_DIR", value_name = "DIR")]
    pub policy_dir: Option<PathBuf>,

    /// Refused with the reason: gc decides each key with the settings its newest generation
    /// recorded (change them with `publish --setting`), never with settings given to gc.
    #[arg(long, hide = true, value_name = "KIND:NAME=VALUE")]
    pub setting: Vec<String>,
}
