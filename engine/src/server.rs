//! The server `jitship run` starts as its child (docs/guide/run.md): started in a process group
//! of its own, sent the signals jitship receives, and waited for without a race between its exit
//! and a forwarded signal.
//!
//! - **Its own process group.** A Ctrl-C in a terminal reaches the terminal's foreground group
//!   only, that is jitship, which forwards it once; in the same group the server would get it
//!   twice (from the terminal and from jitship), and servers treat a second SIGINT as "quit
//!   now". In a container nothing changes: the runtime signals jitship, PID 1, alone.
//! - **No signal to a reaped pid.** The exit is observed with `waitid(WNOWAIT)`, which leaves the
//!   child a zombie: its pid cannot be reused until [`Server::reap`], so a signal forwarded in
//!   between reaches nothing, never another process.
//! - **The exit status as a shell gives it**: the server's code, or 128 + the signal that
//!   ended it ([`exit_code`]).

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};

/// A running server.
pub struct Server {
    child: Child,
    pid: Pid,
    /// Its exit has been observed: it is a zombie now (or reaped), and gets no more signals.
    exited: bool,
}

/// Why a server could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the server {program:?}: {source}")]
pub struct SpawnError {
    pub program: OsString,
    #[source]
    pub source: std::io::Error,
}

impl SpawnError {
    /// No such program (a shell's 127), rather than one that cannot be executed (126).
    pub fn is_not_found(&self) -> bool {
        self.source.kind() == std::io::ErrorKind::NotFound
    }
}

impl Server {
    /// Starts `argv[0]` with the rest as its arguments, in a new process group, inheriting
    /// jitship's environment, working directory and standard streams.
    pub fn spawn(argv: &[OsString]) -> Result<Self, SpawnError> {
        let (program, args) = argv.split_first().ok_or_else(|| SpawnError {
            program: OsString::new(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no server command given"),
        })?;
        let child = Command::new(program)
            .args(args)
            .process_group(0)
            .spawn()
            .map_err(|source| SpawnError {
                program: program.clone(),
                source,
            })?;
        let pid = Pid::from_raw(child.id() as i32).expect("a child's pid is positive");
        Ok(Self {
            child,
            pid,
            exited: false,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the server, unless its exit was already observed. A failure (it exited
    /// just now) is logged, not returned: there is nothing else to do about it.
    pub fn signal(&self, signal: Signal) {
        if self.exited {
            return;
        }
        if let Err(e) = rustix::process::kill_process(self.pid, signal) {
            tracing::debug!(pid = self.pid.as_raw_nonzero().get(), ?signal, error = %e, "forwarding a signal to the server failed");
        }
    }

    /// A future that resolves once the server has exited, without reaping it (`WNOWAIT`), so
    /// [`signal`](Self::signal) stays safe until [`reap`](Self::reap). Waits on a thread of its
    /// own (a blocking `waitid`).
    pub fn exited(&self) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let pid = self.pid;
        std::thread::Builder::new()
            .name("server-wait".into())
            .spawn(move || {
                // Exited, or no such child any more (already reaped): either way it is gone.
                while let Err(rustix::io::Errno::INTR) = rustix::process::waitid(
                    WaitId::Pid(pid),
                    WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
                ) {}
                let _ = tx.send(());
            })
            .expect("starting the thread that waits for the server");
        rx
    }

    /// Reaps the server once [`exited`](Self::exited) resolved; its exit status.
    pub fn reap(&mut self) -> std::io::Result<ExitStatus> {
        self.exited = true;
        self.child.wait()
    }
}

/// The exit code of a server that ended with `status`: its own code, or 128 + the signal that
/// ended it.
pub fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<OsString> {
        ["sh", "-c", script].iter().map(OsString::from).collect()
    }

    #[tokio::test]
    async fn the_exit_code_is_the_servers_or_128_plus_its_signal() {
        let mut s = Server::spawn(&sh("exit 7")).unwrap();
        s.exited().await.unwrap();
        assert_eq!(exit_code(s.reap().unwrap()), 7);
        let mut s = Server::spawn(&sh("kill -TERM $$; sleep 5")).unwrap();
        s.exited().await.unwrap();
        assert_eq!(exit_code(s.reap().unwrap()), 128 + libc::SIGTERM);
    }

    #[tokio::test]
    async fn a_forwarded_signal_reaches_the_server_and_none_after_its_exit() {
        // SIGTERM, not SIGINT: a test run started in the background by a non-interactive shell
        // inherits SIGINT ignored, and so does a child of this test process, which installs no
        // handler (`jitship run` does, so its server starts with the default). Seen in CI: sleep
        // ignored SIGINT and exited 0 after its 30 s.
        let mut s = Server::spawn(&["sleep", "30"].map(OsString::from)).unwrap();
        let exited = s.exited();
        s.signal(Signal::TERM);
        exited.await.unwrap();
        // Observed but not reaped: still safe to "signal" (a zombie ignores it).
        s.signal(Signal::TERM);
        assert_eq!(exit_code(s.reap().unwrap()), 128 + libc::SIGTERM);
        s.signal(Signal::TERM);
    }

    #[test]
    fn a_missing_program_is_not_found_and_an_unexecutable_one_is_not() {
        let e = Server::spawn(&[OsString::from("/nonexistent/jitship-no-such-server")])
            .err()
            .unwrap();
        assert!(e.is_not_found(), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-executable");
        std::fs::write(&file, "#!/bin/sh\n").unwrap();
        let e = Server::spawn(&[file.into_os_string()]).err().unwrap();
        assert!(!e.is_not_found(), "{e}");
    }
}
