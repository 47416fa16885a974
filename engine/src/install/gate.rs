//! When an install stops: the commit gate that makes "timed out" and "moved files into the root"
//! mutually exclusive, and the cutoff every step checks between store calls and writes.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::report::InstallError;

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
