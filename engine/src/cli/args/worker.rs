//! The commands that work on caches: `publish`, `install`, `watch`, `run`, `facts`, `audit`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{CacheArgs, ConfigArg, FactArgs, SettingsArgs};
use crate::config;

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
    #[command(flatten)]
    pub config: ConfigArg,

    #[command(flatten)]
    pub facts: FactArgs,

    #[command(flatten)]
    pub caches: CacheArgs,

    /// The engine whose caches to show (`vllm`, `sglang`): those it reads here, as publish and
    /// install choose them, with why.
    #[arg(long, env = "JITSHIP_ENGINE", value_name = "ENGINE")]
    pub engine: Option<config::Engine>,

    /// Print {"facts", "sources", "missing", "roots"} as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `audit` needs no store and no facts: the caches (and the config file that may list them).
#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub config: ConfigArg,

    /// The engine whose caches to audit, as install resolved them (`vllm`, `sglang`): each of
    /// its roots that holds an install record.
    #[arg(long, env = "JITSHIP_ENGINE", value_name = "ENGINE")]
    pub engine: Option<config::Engine>,

    #[command(flatten)]
    pub caches: CacheArgs,

    /// Print the JSON envelope on stdout (for scripts) instead of the summary.
    #[arg(long, help_heading = "Output")]
    pub json: bool,
}
