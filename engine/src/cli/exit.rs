//! Process exit codes: every command's outcome maps through these constants (install outcomes
//! through `InstallOutcome::exit_code`), and each command's `--help` lists its codes from the texts
//! below (a unit test checks the texts against the constants). And how the process ends: [`end`].

use std::io::Write;
use std::time::Duration;

use super::output::Stage;
use crate::install::InstallOutcome;
use crate::interrupt::Interrupt;
use crate::publish::PublishError;

/// Done (install: files installed).
pub const OK: i32 = 0;
/// The command could not run: configuration, an unreachable store for a store command, a failed
/// publish or gc removal.
pub const ERROR: i32 = 1;
/// Usage error (unknown flag, bad value): clap's own code.
pub const USAGE: i32 = 2;
/// `verify` found a problem (named on the output).
pub const PROBLEM_FOUND: i32 = 3;
/// `audit`: the engine compiled anyway (the files it added or rewrote are on the output).
pub const COMPILED_ANYWAY: i32 = 3;
/// `gc`: done, but retention did not decide some keys (kept whole: their policy is not here or
/// failed, or a manifest cannot be read); the summary line counts them and says why.
pub const GC_NOT_DECIDED: i32 = 4;
/// A second SIGTERM/SIGINT cut `watch`'s final publish short (128 + SIGINT); `install` and
/// `publish` stopped by SIGINT.
pub const INTERRUPTED: i32 = 130;
/// `install` and `publish` stopped by SIGTERM (128 + SIGTERM), at a safe point
/// (`crate::interrupt`).
pub const TERMINATED: i32 = 143;

/// `run`: the server could not be started: not executable (as a shell says it).
pub const NOT_EXECUTABLE: i32 = 126;
/// `run`: the server could not be started: no such program.
pub const NOT_FOUND: i32 = 127;

/// The code of an `install` or `publish` stopped by a signal (`crate::interrupt`), if one was.
pub fn stopped(interrupt: &Interrupt) -> Option<i32> {
    interrupt.signal().map(|signal| match signal {
        libc::SIGINT => INTERRUPTED,
        _ => TERMINATED,
    })
}

/// The stage a failed publish is reported under, from the one classification of `PublishError`
/// (`crate::watch::error_kind`, the watcher's metrics label): what the operator fixes is a
/// setting (config), the store, the policy, or else the publish itself (run).
pub fn publish_stage(e: &PublishError) -> Stage {
    use crate::watch::metrics::ErrorKind;
    match crate::watch::error_kind(e) {
        ErrorKind::Config => Stage::Config,
        ErrorKind::Store => Stage::Store,
        ErrorKind::Policy => Stage::Policy,
        ErrorKind::Scan
        | ErrorKind::Read
        | ErrorKind::Catalog
        | ErrorKind::Contention
        | ErrorKind::Interrupted
        | ErrorKind::Panic
        | ErrorKind::Watch
        | ErrorKind::WatchLimit
        | ErrorKind::Overflow => Stage::Run,
    }
}

/// The most severe of several install outcomes, as the exit code (`--best-effort`: always 0).
pub fn install(outcomes: impl IntoIterator<Item = InstallOutcome>, best_effort: bool) -> i32 {
    if best_effort {
        return OK;
    }
    outcomes
        .into_iter()
        .max_by_key(|o| o.severity())
        .map_or(OK, InstallOutcome::exit_code)
}

pub const INSTALL_HELP: &str = "\
Exit codes (with several caches the most severe outcome wins; --best-effort exits 0 for all):
  0   installed
  10  already-current: every file of the newest generation is on disk
  11  miss: nothing published for this worker's key, or it was evicted
  12  failed: store unreachable, policy or fact missing, corrupt data; root left as it was
  13  conflict: files of the generation are on disk with other content and were left alone (only
      partly installed)
  14  untrusted: with [trust] mode required, no candidate generation was signed by a trusted key
  15  deadline: --deadline (counted from the process's start) passed before the install finished;
      root left as it was; the process exits within the deadline plus 2 s
  1   configuration error (flags, config file, trust settings, an unresolvable root)
  2   usage error (before anything ran)
  143 stopped by SIGTERM (130: SIGINT): a cache not yet moving files into its root was left as it
      was, one already moving them finished; a second signal ends the process at once";

pub const PUBLISH_HELP: &str = "\
Exit codes:
  0   every cache published, unchanged or empty
  1   a cache failed (store unreachable, policy, missing fact, ...), or its generation is in the
      store but the durable registry tier refused it; --json lists it under errors
  2   usage error
  143 stopped by SIGTERM (130: SIGINT) before writing a head: nothing of it was published; a
      second signal ends the process at once";

pub const WATCH_HELP: &str = "\
Exit codes:
  0   stopped cleanly (final publish done, or held by the readiness gate)
  1   configuration error, or the final publish failed or ran out of time
  2   usage error
  130 a second signal cut the final publish short";

pub const RUN_HELP: &str = "\
Exit codes:
  N   the server's own exit status (128 + the signal when a signal ended it), whatever the
      install and the publishes did (they are logged; --report keeps the install's envelope)
  126 the server could not be started: not executable
  127 the server could not be started: not found
  2   usage error
  143 stopped by SIGTERM (130: SIGINT) during the install: the server was never started";

pub const VERIFY_HELP: &str = "\
Exit codes:
  0   every checked generation is intact (and, under trust mode warn or required, trusted)
  1   error (configuration, store unreachable)
  2   usage error
  3   a problem was found (named on the output): a damaged pack or file, an untrusted head, a
      tier (with --durable-store) that announces a generation it does not hold whole";

pub const AUDIT_HELP: &str = "\
Exit codes:
  0   the engine compiled nothing anyway: it ran from the installed cache
  1   error: no install record beside a root, configuration
  2   usage error
  3   the engine compiled anyway: added or rewrote compiled files (listed on the output)";

pub const GC_HELP: &str = "\
Exit codes:
  0   done (or nothing to do): retention decided every key
  1   error, or some keys could not be removed (run gc again: it resumes from its journal)
  2   usage error
  4   done, but some keys were kept whole, not decided by retention (their policy is not here
      or failed, or a manifest cannot be read): the summary line counts them and says why";

/// ls, inspect, pin, unpin, facts, completions, key, policy build.
pub const SIMPLE_HELP: &str = "\
Exit codes:
  0   done
  1   error (configuration, store unreachable, unknown generation, ...)
  2   usage error";

pub const POLICY_CHECK_HELP: &str = "\
Exit codes:
  0   jitship would load this module
  1   refused (the reason is printed)
  2   usage error";

pub const POLICY_TEST_HELP: &str = "\
Exit codes:
  0   every call answered
  1   a call failed or refused, the module was refused, or jitship rejected an input
      (--generations, --root)
  2   usage error";

/// How long after the newest Mooncake teardown began [`end`] waits for those still running.
/// `destroy` removes the client's metadata entries within milliseconds of starting (measured:
/// under 15 ms on a loaded 2-core machine) and then only waits for the library's listener thread;
/// past this, the process ends without waiting for that.
pub const TEARDOWN_GRACE: Duration = Duration::from_millis(50);

/// Longest [`end`] waits for a Mooncake client still held by a thread that is finishing its last
/// call after the command gave up on it (an install stopped by its deadline or by SIGTERM), so
/// that its teardown still removes its metadata entry. A call stuck in the library for longer (up
/// to `call_timeout`) is not waited for.
pub const CLIENT_LINGER: Duration = Duration::from_secs(1);

/// Ends the process with `code` once every Mooncake client is dropped (at most [`CLIENT_LINGER`])
/// and the teardowns begun by those drops are done, or [`TEARDOWN_GRACE`] after the newest began
/// (`store::wait_for_teardowns`; the store hands teardowns to threads after
/// `store::defer_teardowns`), with `_exit` after flushing stdout, stderr and C stdio. Why not
/// `std::process::exit`: exit handlers and the library's static destructors must not run while a
/// teardown thread is still inside `destroy` (that race aborted CLI processes with "double free or
/// corruption" before commit edacd18), and even after it they took 0.5 s of a 1.2 s command
/// (measured on the loaded 2-core build machine) tearing down what the kernel frees anyway.
/// Nothing is lost: by now every store call has returned (puts are synchronous) and every Rust
/// value of the command has been dropped; the kernel frees the memory and closes the sockets.
pub fn end(code: i32) -> ! {
    if !crate::store::wait_for_teardowns(CLIENT_LINGER, TEARDOWN_GRACE) {
        tracing::debug!(
            "mooncake: teardown still running after {TEARDOWN_GRACE:?} (the library's listener thread); exiting"
        );
    }
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: fflush(NULL) flushes every C stdio stream; _exit ends the process at once, and
    // nothing of this process runs after it.
    unsafe {
        libc::fflush(std::ptr::null_mut());
        libc::_exit(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_help_lists_each_outcome_with_its_code() {
        for (outcome, word) in [
            (InstallOutcome::Installed, "installed"),
            (InstallOutcome::AlreadyCurrent, "already-current"),
            (InstallOutcome::Miss, "miss"),
            (InstallOutcome::Failed, "failed"),
            (InstallOutcome::Conflict, "conflict"),
            (InstallOutcome::Untrusted, "untrusted"),
            (InstallOutcome::Deadline, "deadline"),
        ] {
            let line = format!("  {:<3} {word}", outcome.exit_code());
            assert!(INSTALL_HELP.contains(&line), "{line:?} not in INSTALL_HELP");
            // The JSON spelling of the outcome is the word the help uses.
            assert_eq!(serde_json::to_value(outcome).unwrap(), word);
        }
    }

    #[test]
    fn the_worst_outcome_wins_unless_best_effort() {
        use InstallOutcome::*;
        assert_eq!(install([AlreadyCurrent, Installed], false), 0);
        assert_eq!(install([AlreadyCurrent], false), 10);
        assert_eq!(install([Installed, Miss, AlreadyCurrent], false), 11);
        assert_eq!(install([Miss, Failed, Installed], false), 12);
        assert_eq!(install([Installed, Conflict, Miss], false), 13);
        assert_eq!(install([Conflict, Untrusted], false), 14);
        assert_eq!(install([Untrusted, Failed], false), 12);
        assert_eq!(install([Untrusted, Deadline], false), 15);
        assert_eq!(install([Deadline, Failed], false), 12);
        assert_eq!(install([Failed], true), OK);
        assert_eq!(install([], false), OK);
    }

    #[test]
    fn a_stopped_command_exits_with_128_plus_its_signal() {
        assert_eq!(stopped(&Interrupt::default()), None);
        for signal in [libc::SIGTERM, libc::SIGINT] {
            let interrupt = Interrupt::default();
            interrupt.raise(signal);
            assert_eq!(stopped(&interrupt), Some(128 + signal));
        }
    }

    /// How far past `install --deadline` (counted from the process's start) the process may end,
    /// as the help and the README say: at the deadline the install stops waiting for its work,
    /// removes its staging for at most `install::CLEANUP_GRACE`, prints, and [`end`] waits at most
    /// [`CLIENT_LINGER`] and [`TEARDOWN_GRACE`] for the Mooncake client; the rest is room for a
    /// loaded machine.
    #[test]
    fn the_install_help_states_the_deadline_margin() {
        const DEADLINE_MARGIN: Duration = Duration::from_secs(2);
        let said = format!("the deadline plus {} s", DEADLINE_MARGIN.as_secs());
        assert!(INSTALL_HELP.contains(&said), "{said:?} not in INSTALL_HELP");
        assert!(
            crate::install::CLEANUP_GRACE + CLIENT_LINGER + TEARDOWN_GRACE < DEADLINE_MARGIN,
            "the margin covers the bounded steps after the deadline"
        );
    }

    #[test]
    fn help_texts_use_the_constants() {
        for (text, code) in [
            (VERIFY_HELP, PROBLEM_FOUND),
            (AUDIT_HELP, COMPILED_ANYWAY),
            (INSTALL_HELP, ERROR),
            (WATCH_HELP, INTERRUPTED),
            (RUN_HELP, TERMINATED),
            (RUN_HELP, NOT_EXECUTABLE),
            (RUN_HELP, NOT_FOUND),
            (PUBLISH_HELP, ERROR),
            (PUBLISH_HELP, TERMINATED),
            (INSTALL_HELP, TERMINATED),
            (SIMPLE_HELP, USAGE),
            (GC_HELP, GC_NOT_DECIDED),
        ] {
            assert!(text.contains(&format!("  {code:<3} ")), "{code} in {text}");
        }
    }
}
