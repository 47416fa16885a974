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
