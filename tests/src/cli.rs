//! The `jitship` command line as a child process, as operators run it: the `jitship-e2e` binary
//! of this crate (the CLI, plus one start-time hook for concurrency tests).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// `target/<profile>/jitship-e2e`, which cargo builds before any test of this crate. Found from
/// the running test binary (`target/<profile>/deps/<test>`): `CARGO_BIN_EXE_*` is given only to
/// test targets, and this is the library they share.
pub fn exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let test = std::env::current_exe().expect("current exe");
        let bin = test
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>/deps/<test>")
            .join("jitship-e2e");
        assert!(
            bin.exists(),
            "{} not found: run the tests through cargo (`cargo test -p jitship-tests`), which builds it",
            bin.display()
        );
        bin
    })
}

/// A `jitship` command to add arguments and environment to.
pub fn jitship() -> Command {
    Command::new(exe())
}

/// `jitship` as a test means it: warnings only in its log, and none of the operator's
/// environment (a config, caches, policy directory or trust set where the tests run) reaching it.
pub fn quiet() -> Command {
    let mut c = jitship();
    c.env("RUST_LOG", "warn");
    for var in [
        "JITSHIP_CONFIG",
        "JITSHIP_CACHES",
        "JITSHIP_POLICY_DIR",
        "JITSHIP_SIGNING_KEY_FILE",
        "JITSHIP_TRUSTED_KEYS",
        "JITSHIP_TRUST_MODE",
    ] {
        c.env_remove(var);
    }
    c
}

/// Runs `jitship ARGS` (as [`quiet`]) to the end.
pub fn run(args: &[&str]) -> std::process::Output {
    quiet().args(args).output().expect("run jitship-e2e")
}

/// Runs `jitship ARGS` with exactly `env` (PATH is `/nonexistent` unless `env` names it): no
/// program, config or fact of this machine reaches it. Returns (exit code, stdout, stderr).
pub fn bare(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut c = jitship();
    c.args(args).env_clear().env("PATH", "/nonexistent");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run jitship-e2e");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}
