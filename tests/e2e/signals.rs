//! Stop signals reach jitship whatever mask its parent passed on. A process starts with its
//! parent's signal mask, and a parent that loaded Mooncake's library (an engine with Mooncake's
//! connector, this test binary in the Mooncake drills) has SIGHUP, SIGINT, SIGUSR1 and SIGTERM
//! blocked; jitship clears the mask first thing (`interrupt::clear_inherited_signal_mask`).

use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::Duration;

/// A watcher started with its stop signals blocked (here by the parent, as Mooncake's library
/// leaves them) stops on SIGTERM with its final publish, instead of never seeing the signal.
#[test]
fn a_watcher_started_with_stop_signals_blocked_still_stops_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let log = tmp.path().join("watch.log");
    let mut cmd = jitship_tests::cli::jitship();
    cmd.arg("watch")
        .arg("--store")
        .arg(format!("local:{}", tmp.path().join("store").display()))
        .args(["--fact", "model.id=signals", "--cache"])
        .arg(format!("kernels:native={}", root.display()))
        .args(["--settle", "100ms", "--rescan-interval", "3600s", "-v"])
        .env_remove("JITSHIP_CONFIG")
        .env_remove("JITSHIP_CACHES")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    // SAFETY: between fork and exec only async-signal-safe calls (sigemptyset, sigaddset,
    // pthread_sigmask) on a local set.
    unsafe {
        cmd.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGHUP, libc::SIGINT, libc::SIGUSR1, libc::SIGTERM] {
                libc::sigaddset(&mut set, s);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("starting jitship watch");
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut exited = None;
    let started =
        jitship_tests::child::wait_for_change(tmp.path(), Duration::from_secs(60), || {
            exited = child.try_wait().unwrap();
            logged().contains("jitship watch started") || exited.is_some()
        });
    assert!(
        started && exited.is_none(),
        "watch did not start ({exited:?}):\n{}",
        logged()
    );
    let pid = child.id() as i32;
    // Waited for on a thread, so the test can give up on a watcher that never sees the signal.
    let (tx, exit) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    // SAFETY: kill(2) on our own child, still running.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let Ok(status) = exit.recv_timeout(Duration::from_secs(60)) else {
        // SAFETY: as above; the waiting thread reaps it.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        panic!(
            "watch did not stop on SIGTERM (still blocked?):\n{}",
            logged()
        );
    };
    let text = logged();
    assert_eq!(status.unwrap().code(), Some(0), "watch:\n{text}");
    assert!(text.contains("stopping: final publish"), "watch:\n{text}");
    assert!(text.contains("jitship watch stopped"), "watch:\n{text}");
}
