//! The `jitship` command line: parses flags, resolves settings (flags > JITSHIP_* env > config file
//! > defaults), runs one command and turns its outcome into output and an exit code. Every
//! decision lives in the library modules; this module only wires them.
//!
//! - `args`: the clap definitions and how flags, env and the config file resolve into a `Config`.
//! - `session`: the store, key layout, facts and policies one command works with.
//! - `commands`: one function per command, grouped as worker (publish, install, watch, facts),
//!   store (ls, inspect, verify, pin, unpin, gc), audit (did the engine use the installed
//!   cache), key and policy-author commands.
//! - `render`: how reports print for a person (tables, summaries, spinners).

mod args;
mod commands;
mod render;
mod session;

pub use args::*;

use anyhow::Result;
use clap::Parser;

/// Entry point of the binary: runs the command and ends the process with its exit code, without
/// waiting for the Mooncake library's slow teardown (see `store::mooncake::exit`).
pub fn main_and_exit() -> ! {
    crate::store::mooncake::defer_teardown_to_exit();
    let code = main();
    crate::store::mooncake::exit(code)
}

/// Runs the command line: returns the process exit code.
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
        Command::Publish(args) => commands::worker::run_publish(args),
        Command::Install(args) => commands::worker::run_install(args),
        Command::Watch(args) => commands::worker::run_watch(args),
        Command::Facts(args) => commands::worker::run_facts(args),
        Command::Policy(cmd) => commands::policy::run_policy(cmd),
        Command::Ls(args) => commands::store::run_ls(args),
        Command::Inspect(args) => commands::store::run_inspect(args),
        Command::Verify(args) => commands::store::run_verify(args),
        Command::Pin(args) => commands::store::run_pin(args, true),
        Command::Unpin(args) => commands::store::run_pin(args, false),
        Command::Gc(args) => commands::store::run_gc(args),
        Command::Key(cmd) => commands::key::run_key(cmd),
        Command::Audit(args) => commands::audit::run_audit(args),
    }
}
