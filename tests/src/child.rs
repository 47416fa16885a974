//! Running a command as a child process and measuring it, for benchmarks.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub struct Run {
    pub wall: Duration,
    /// The exit code; -1 when a signal ended the process.
    pub code: i32,
    pub max_rss_kib: i64,
    pub stdout: String,
}

/// Runs `cmd` and returns its wall time, peak RSS and stdout; panics unless it exits with one of
/// `ok_codes`. The peak is the child's own `VmHWM`, polled from /proc while it runs: the rusage
/// `maxrss` of a spawned child also counts the parent's pages it briefly shared before exec.
pub fn run_measured(cmd: &mut Command, ok_codes: &[i32]) -> Run {
    let start = Instant::now();
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let status_path = format!("/proc/{}/status", child.id());
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut s).ok();
        s
    });
    let mut peak_kib = 0i64;
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&status_path)
            && let Some(kib) = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        {
            peak_kib = peak_kib.max(kib);
        }
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let wall = start.elapsed();
    let stdout = reader.join().unwrap_or_default();
    let code = status.code().unwrap_or(-1);
    assert!(
        ok_codes.contains(&code),
        "{cmd:?} exited {code} (expected one of {ok_codes:?}): {stdout}"
    );
    Run {
        wall,
        code,
        max_rss_kib: peak_kib,
        stdout,
    }
}

/// The `jitship` binary a bench runs as a child process, as operators do: `JITSHIP_BIN` (e.g. a
/// binary built from an older commit, for before-and-after figures), else the one of the profile
/// this bench was built with (`target/<profile>/jitship`).
pub fn jitship_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("JITSHIP_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("current exe");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<bench>")
        .join("jitship");
    assert!(
        bin.exists(),
        "{} not found: build it first with `cargo build --release --workspace --bin jitship` \
         (or without --release for a dev-profile bench)",
        bin.display()
    );
    bin
}

/// Flushes the file systems (`sync`) before a timed run, so it is not billed for writeback and
/// discards left by earlier runs and their removed trees (on this machine's ext4 mounted with
/// `discard`, a `tar -x` after removing a 48,000-file tree took 25 s instead of 1).
pub fn settle() {
    let status = Command::new("sync").status().expect("run sync");
    assert!(status.success(), "sync failed: {status}");
}

/// Waits until `done()` holds, checking it again at each change under `dir` (inotify: a write,
/// a close, a rename), for at most `within`; whether it held. A child's log under `dir` changes
/// as it writes and when it exits, so this waits on the child, never on a timer.
pub fn wait_for_change(dir: &Path, within: Duration, mut done: impl FnMut() -> bool) -> bool {
    use notify::Watcher;
    let (tx, changes) = std::sync::mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |_| {
        let _ = tx.send(());
    })
    .expect("an inotify watcher");
    watcher
        .watch(dir, notify::RecursiveMode::Recursive)
        .expect("watching the test's directory");
    let deadline = Instant::now() + within;
    // Checked after the watch starts, so no change between the check and the wait is missed.
    while !done() {
        let left = deadline.saturating_duration_since(Instant::now());
        if changes.recv_timeout(left).is_err() {
            return done();
        }
    }
    true
}
