//! When an install stops: the commit gate that makes "timed out" and "moved files into the root"
//! mutually exclusive, the cutoff every step checks between store calls and writes, and the clock
//! a command-line install's deadline counts from (the process's start), and the wait for the
//! job that ends at the deadline or an interrupt.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use crate::interrupt::Interrupt;

use super::report::InstallError;

static PROCESS_START: OnceLock<Instant> = OnceLock::new();

/// Notes the process's start, first thing in `main`: the CLI's `--deadline` counts from here, so
/// connecting to the store, gathering facts and loading policies spend it too.
pub fn mark_process_start() {
    PROCESS_START.get_or_init(Instant::now);
}

/// When the process started ([`mark_process_start`]; else the first call).
pub fn process_start() -> Instant {
    *PROCESS_START.get_or_init(Instant::now)
}

/// Longest an install stopped at its deadline waits for its staging directory to be removed;
/// past it the removal goes on while the process ends, and the next install removes what is left
/// (as after a SIGKILL). Part of the margin `--deadline` documents (`cli::exit::DEADLINE_MARGIN`).
pub const CLEANUP_GRACE: Duration = Duration::from_millis(300);

/// Runs `cleanup` on a thread of its own and waits for it at most [`CLEANUP_GRACE`]; whether it
/// finished.
pub(super) fn bounded_cleanup(cleanup: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("install-cleanup".into())
        .spawn(move || {
            cleanup();
            let _ = tx.send(());
        });
    spawned.is_ok() && rx.recv_timeout(CLEANUP_GRACE).is_ok()
}

#[derive(Default)]
pub(super) struct CommitGate {
    state: Mutex<GateState>,
    /// The staging directory of the running install, removed by whoever cancels it.
    staging: Mutex<Option<PathBuf>>,
}

#[derive(Default, PartialEq, Eq)]
enum GateState {
    #[default]
    Working,
    Committing,
    Cancelled,
}

impl CommitGate {
    /// The job asks to start moving files into the root.
    pub(super) fn enter_commit(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if *s == GateState::Cancelled {
            return false;
        }
        *s = GateState::Committing;
        true
    }

    pub(super) fn cancelled(&self) -> bool {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) == GateState::Cancelled
    }

    /// The deadline passed: cancel, unless the job is already committing.
    pub(super) fn cancel_unless_committing(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if *s == GateState::Committing {
            return false;
        }
        *s = GateState::Cancelled;
        true
    }

    /// Remembers the staging directory a cancel must remove.
    pub(super) fn set_staging(&self, path: Option<PathBuf>) {
        *self.staging.lock().unwrap_or_else(|e| e.into_inner()) = path;
    }

    /// Takes the staging directory to remove, if any.
    pub(super) fn take_staging(&self) -> Option<PathBuf> {
        self.staging
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

/// The point past which the job stops: the install's deadline, or the gate cancelled (by the
/// waiting side, at the deadline or on a signal).
#[derive(Clone)]
pub(super) struct Cutoff {
    pub(super) gate: Arc<CommitGate>,
    pub(super) deadline: Instant,
}

impl Cutoff {
    pub(super) fn check(&self) -> Result<(), InstallError> {
        if self.gate.cancelled() || Instant::now() >= self.deadline {
            return Err(InstallError::Cancelled);
        }
        Ok(())
    }
}

/// The job's answer, or why the install stops waiting for it: `deadline` (the point in time;
/// `allowed` is what the report says was allowed) passed or the interrupt was raised (looked at
/// every 20 ms: a signal handler can only set a flag).
pub fn wait_for_job<T>(
    rx: &mpsc::Receiver<T>,
    deadline: Instant,
    allowed: Duration,
    interrupt: &Interrupt,
) -> Result<T, InstallError> {
    const INTERRUPT_POLL: Duration = Duration::from_millis(20);
    loop {
        if let Some(signal) = interrupt.signal_name() {
            return Err(InstallError::Interrupted(signal));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(INTERRUPT_POLL)) {
            Ok(answer) => return Ok(answer),
            Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => continue,
            Err(_) => return Err(InstallError::Deadline(allowed)),
        }
    }
}
