//! The `jitship` command line: parses flags, resolves settings (flags, then JITSHIP_* env, then
//! the config file, then defaults), runs one command and turns its outcome into output and an
//! exit code. Every
//! decision lives in the library modules; this module only wires them.
//!
//! - `args`: the clap definitions and how flags, env and the config file resolve into a `Config`.
//! - `session`: the store, key layout, facts, trust and policies one command works with
//!   (`CacheSession` for publish, install and watch: a store or policy engine that cannot be
//!   opened becomes each cache's failure, not the command's).
//! - `commands`: one function per command, grouped as worker (publish, install, watch, facts),
//!   store (ls, inspect, verify, pin, unpin, gc), audit (did the engine use the installed
//!   cache), key and policy-author commands.
//! - `exit`: every exit code, and the texts each command's `--help` lists them with.
//! - `output`: the versioned JSON envelope of `--json` and `install --report`.
//! - `render`: how reports print for a person (tables, summaries, progress, errors).

mod args;
mod commands;
mod exit;
mod output;
mod render;
mod session;

pub use args::{Cli, Command, SettingsArgs};
use args::{ColorChoice, LogFormat};

use std::io::IsTerminal;

use anyhow::Result;
use clap::{CommandFactory, Parser};

/// Entry point of the binary: runs the command and ends the process with its exit code, without
/// waiting for the Mooncake library's slow teardown (see `exit::end`).
pub fn main_and_exit() -> ! {
    // Before any thread starts (they inherit it): see its comment.
    crate::interrupt::clear_inherited_signal_mask();
    crate::store::defer_teardowns();
    let code = main();
    exit::end(code)
}

/// Runs the command line: returns the process exit code.
pub fn main() -> i32 {
    output::mark_start();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // --help and --version are not errors.
            return if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
        }
    };
    init_logging(cli.log_format, cli.color, cli.verbose);
    render::set_verbosity(cli.verbose);
    tracing::debug!("jitship {} starting", env!("CARGO_PKG_VERSION"));
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            render::print_error(&e);
            exit::ERROR
        }
    };
    tracing::debug!(code, "jitship done");
    code
}

/// Whether stderr gets colour: `always`/`never` as asked; `auto` only on a terminal and never
/// when `NO_COLOR` is set to anything non-empty (no-color.org).
fn use_color(choice: ColorChoice) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => {
            std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                && std::io::stderr().is_terminal()
        }
    }
}

fn init_logging(format: LogFormat, color: ColorChoice, verbose: u8) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        // Escaped: log lines name store records (`render::LogWriter`).
        LogFormat::Text => builder
            .with_writer(render::LogWriter)
            .with_ansi(use_color(color))
            .with_target(false)
            .init(),
        // One object per line, the event's fields at the top level beside "message".
        LogFormat::Json => builder
            .with_writer(std::io::stderr)
            .json()
            .with_ansi(false)
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}

pub fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Publish(args) => commands::worker::run_publish(args),
        Command::Install(args) => commands::worker::run_install(args),
        Command::Watch(args) => commands::worker::run_watch(args),
        Command::Run(args) => commands::run::run_server(args),
        Command::Facts(args) => commands::worker::run_facts(args),
        Command::Policy(cmd) => commands::policy::run_policy(cmd),
        Command::Ls(args) => json_errors("ls", args.common.json, || commands::store::run_ls(args)),
        Command::Inspect(args) => json_errors("inspect", args.common.json, || {
            commands::store::run_inspect(args)
        }),
        Command::Verify(args) => json_errors("verify", args.common.json, || {
            commands::store::run_verify(args)
        }),
        Command::Pin(args) => {
            json_errors("pin", args.common.json, || commands::store::run_pin(args))
        }
        Command::Unpin(args) => json_errors("unpin", args.common.json, || {
            commands::store::run_unpin(args)
        }),
        Command::Gc(args) => json_errors("gc", args.common.json, || commands::store::run_gc(args)),
        Command::Export(args) => json_errors("export", args.common.json, || {
            commands::store::run_export(args)
        }),
        Command::Import(args) => json_errors("import", args.common.json, || {
            commands::store::run_import(args)
        }),
        Command::Audit(args) => {
            json_errors("audit", args.json, || commands::audit::run_audit(args))
        }
        Command::Key(cmd) => commands::key::run_key(cmd),
        Command::Completions(args) => {
            clap_complete::generate(
                args.shell,
                &mut Cli::command(),
                "jitship",
                &mut std::io::stdout(),
            );
            Ok(exit::OK)
        }
    }
}

/// With `--json`, a command that fails still prints its envelope (with the error) on stdout.
fn json_errors(
    command: &'static str,
    json: bool,
    run: impl FnOnce() -> Result<i32>,
) -> Result<i32> {
    match run() {
        Err(e) if json => {
            render::print_error(&e);
            Ok(output::Envelope::start(command).print_failure(&e, output::Stage::Run))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn store_commands_take_no_cache_or_fact_and_unpin_no_reason() {
        for cmd in ["ls", "inspect", "verify", "pin", "unpin", "gc"] {
            for flag in ["--cache", "--fact"] {
                // gc takes --cache: the modules of the policies that govern keys (`gc`).
                if (cmd, flag) == ("gc", "--cache") {
                    continue;
                }
                let mut argv = vec!["jitship", cmd];
                if matches!(cmd, "inspect" | "pin" | "unpin") {
                    argv.push("0123456789abcdef");
                }
                argv.extend([flag, "x=y"]);
                let err = Cli::try_parse_from(&argv).expect_err(&argv.join(" "));
                assert_eq!(err.kind(), clap::error::ErrorKind::UnknownArgument);
            }
        }
        assert!(Cli::try_parse_from(["jitship", "gc", "--cache", "k:m.wasm"]).is_ok());
        assert!(
            Cli::try_parse_from(["jitship", "unpin", "0123456789ab", "--reason", "x"]).is_err()
        );
        assert!(Cli::try_parse_from(["jitship", "pin", "0123456789ab", "--reason", "x"]).is_ok());
    }

    #[test]
    fn every_command_lists_its_exit_codes_in_help() {
        let mut cli = Cli::command();
        cli.build();
        for sub in cli.get_subcommands().filter(|c| c.get_name() != "help") {
            let subs: Vec<&clap::Command> = if sub.has_subcommands() {
                sub.get_subcommands().collect()
            } else {
                vec![sub]
            };
            for c in subs.into_iter().filter(|c| c.get_name() != "help") {
                let help = c
                    .get_after_help()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                assert!(
                    help.starts_with("Exit codes"),
                    "`{}` --help lists no exit codes",
                    c.get_name()
                );
            }
        }
    }
}
