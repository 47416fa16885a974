//! Stopping a one-shot command (`install`, `publish`) on SIGTERM or SIGINT at a point where
//! stopping is safe, instead of dying of the signal's default action.
//!
//! Why: killed outright, an install can be cut between two renames into the root (a cache the
//! engine reads half-installed) and leaves its staging directory, and either command leaves its
//! Mooncake client entry in the metadata server. Asked to stop, an install that has not begun
//! moving files into the root abandons the work and leaves the root as it was; one that has
//! begun finishes the commit (it is quick). A publish stops between files or packs and writes no
//! head, so nothing of it is visible (invariant 1). The command then returns normally, so the
//! store is torn down as on any exit, and the process exits with 128 + the signal's number (`cli::exit`).
//!
//! A second signal ends the process at once with that code: an operator who presses Ctrl-C twice
//! or a kubelet that loses patience is never made to wait.
//!
//! `watch` has its own handling (the first signal triggers a final publish) and does not use this.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Clears the signal mask the process inherited, first thing in `cli::main_and_exit`, before any thread starts
/// (threads inherit the mask of the thread that starts them).
///
/// Why: a process starts with its parent's mask (a Rust parent does not reset it, nor does
/// Python's `subprocess`). A parent that loaded Mooncake's library has SIGHUP, SIGINT, SIGUSR1
/// and SIGTERM blocked, and so had every jitship it started: its own handlers never ran, and the
/// library's signal thread, which waits for the signals it finds blocked, took SIGTERM, tore the
/// client down and raised it again with the default action, so a watcher died without its final
/// publish (docs/mooncake.md, "Signals"). jitship handles its own stop signals, so it starts with
/// none blocked, and so do the servers `run` starts.
pub fn clear_inherited_signal_mask() {
    // SAFETY: an empty set made by sigemptyset, passed to pthread_sigmask for this thread only.
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}

/// Whether the process was asked to stop, and by which signal. Cloned into the options of the
/// work it should stop; `Interrupt::default()` is never raised by a signal (library callers and
/// tests raise it themselves with [`Interrupt::raise`]).
#[derive(Clone, Debug, Default)]
pub struct Interrupt {
    requested: Arc<AtomicBool>,
    signal: Arc<AtomicUsize>,
}

impl Interrupt {
    /// Registers handlers for SIGTERM and SIGINT: the first raises this interrupt, the second
    /// ends the process with 128 + its number. Handlers stay for the life of the process.
    pub fn on_signals() -> std::io::Result<Self> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        use signal_hook::flag;
        let this = Self::default();
        for signal in [SIGTERM, SIGINT] {
            // Handlers run in the order they were registered: the shutdown sees the flag only
            // when an earlier signal has set it.
            flag::register_conditional_shutdown(signal, 128 + signal, this.requested.clone())?;
            flag::register_usize(signal, this.signal.clone(), signal as usize)?;
            flag::register(signal, this.requested.clone())?;
        }
        Ok(this)
    }

    /// Asks the work to stop as `signal` would.
    pub fn raise(&self, signal: i32) {
        self.signal.store(signal as usize, Ordering::SeqCst);
        self.requested.store(true, Ordering::SeqCst);
    }

    /// Whether the work should stop now.
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// The signal that asked, by name ("SIGTERM"), once one did.
    pub fn signal_name(&self) -> Option<&'static str> {
        self.requested()
            .then(|| name(self.signal.load(Ordering::SeqCst) as i32))
    }

    /// The signal that asked (its number), once one did.
    pub fn signal(&self) -> Option<i32> {
        self.requested()
            .then(|| self.signal.load(Ordering::SeqCst) as i32)
    }
}

fn name(signal: i32) -> &'static str {
    match signal {
        signal_hook::consts::SIGTERM => "SIGTERM",
        signal_hook::consts::SIGINT => "SIGINT",
        _ => "a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interrupt_is_quiet_until_raised_and_then_names_its_signal_and_code() {
        let interrupt = Interrupt::default();
        let seen_by_the_work = interrupt.clone();
        assert!(!seen_by_the_work.requested());
        assert_eq!(seen_by_the_work.signal_name(), None);
        assert_eq!(seen_by_the_work.signal(), None);
        interrupt.raise(libc::SIGTERM);
        assert!(seen_by_the_work.requested());
        assert_eq!(seen_by_the_work.signal_name(), Some("SIGTERM"));
        assert_eq!(seen_by_the_work.signal(), Some(libc::SIGTERM));
        let int = Interrupt::default();
        int.raise(libc::SIGINT);
        assert_eq!(int.signal(), Some(libc::SIGINT));
        assert_eq!(int.signal_name(), Some("SIGINT"));
    }
}
