//! Running library calls and ending the handle's life. Every call runs on a thread of its own
//! that holds the client (`Arc<Inner>`) and whatever buffer it uses until the library returns, so
//! a call the caller stopped waiting for (`call_timeout`) never has memory freed under it, and
//! `destroy` runs only after the last call returned.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};

use mooncake_sys as sys;

use super::{Inner, MooncakeStore, teardown};
use crate::{StoreError, StoreResult};

/// Calls stuck in the library beyond this many make new calls fail at once instead of piling up
/// threads.
const MAX_STUCK_CALLS: usize = 64;

/// The client handle.
pub(super) struct Handle(pub(super) sys::mooncake_store_t);
// SAFETY: Mooncake's client object is thread safe (Mooncake's own bindings share one handle
// between all threads of a process); the pointer is only ever passed to the library.
unsafe impl Send for Handle {}
// SAFETY: as for Send: shared use is calls into the library, which synchronizes internally.
unsafe impl Sync for Handle {}

/// Counts a call as in flight for as long as it lives.
struct InFlight(Arc<Inner>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl MooncakeStore {
    /// Runs `f` on its own thread and waits at most `call_timeout` for it.
    pub(super) fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> T + Send + 'static,
    ) -> StoreResult<T> {
        if self.inner.in_flight.fetch_add(1, Ordering::SeqCst) >= MAX_STUCK_CALLS {
            self.inner.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(StoreError::Unavailable(format!(
                "{MAX_STUCK_CALLS} calls to the Mooncake library are still stuck; is master {} answering?",
                self.master
            )));
        }
        let guard = InFlight(self.inner.clone());
        let (tx, rx) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("mooncake-call".into())
            .spawn(move || {
                let r = f(&guard.0);
                // Let go of the handle before answering: otherwise the caller can drop the store
                // and exit while this thread holds the last reference, so `destroy` runs here
                // concurrently with the process's exit handlers (seen as "double free or
                // corruption" aborts of CLI processes after their work was done).
                drop(guard);
                let _ = tx.send(r);
            })
            .map_err(|e| StoreError::Other(format!("cannot start a store call thread: {e}")))?;
        match rx.recv_timeout(self.call_timeout) {
            Ok(r) => Ok(r),
            Err(RecvTimeoutError::Timeout) => Err(StoreError::Timeout(self.call_timeout)),
            Err(RecvTimeoutError::Disconnected) => {
                Err(StoreError::Other("a store call thread panicked".into()))
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Every lease holds an Arc<Inner>, so all buffers are back in the pool by now, and every
        // call has returned (each holds an Arc<Inner> while inside the library).
        let mut buffers = self.pool.take_free();
        let lib = self.lib.clone();
        let handle = Handle(self.handle.0);
        let teardown = move || {
            let handle = handle; // the whole Handle (Send), not its raw pointer field
            for buf in &mut buffers {
                // SAFETY: the handle is live and the buffer was registered with it; no call uses
                // it any more.
                unsafe { (lib.unregister_buffer)(handle.0, buf.as_mut_ptr()) };
            }
            tracing::debug!("mooncake: destroying the client");
            // SAFETY: the handle came from `create`, and nothing else refers to it any more.
            unsafe { (lib.destroy)(handle.0) };
            tracing::debug!("mooncake: client destroyed");
            drop(buffers); // unmapped only after the library let go of them
        };
        teardown::run(teardown);
    }
}
