//! Reading what a finished `jitship` child process said: its exit code, its output in words for
//! a failure message, its JSON.

use std::process::Output;

use serde_json::Value;

/// The exit code; panics if a signal ended the process.
pub fn code(out: &Output) -> i32 {
    out.status.code().expect("exited, not killed")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The exit code, stdout and stderr, for an assertion's message.
pub fn show(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// `out`, after checking it succeeded; panics with `what` and the whole output if not.
pub fn ok(what: &str, out: Output) -> Output {
    assert!(out.status.success(), "{what}: {}", show(&out));
    out
}

/// stdout as JSON; panics with the whole output if it is not.
pub fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", show(out)))
}
