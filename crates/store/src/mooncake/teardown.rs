//! The process-wide count of Mooncake clients and of their teardowns, so a process that ends
//! without running the library's slow `destroy` to its end (the CLI) can wait for what matters
//! first. How long it waits and how it then ends are the process's choice, not the store's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

static DEFER: AtomicBool = AtomicBool::new(false);

/// Clients not dropped yet, teardowns running on their own threads, and when the newest of
/// those began.
struct State {
    clients: usize,
    running: usize,
    newest: Option<Instant>,
}

static STATE: Mutex<State> = Mutex::new(State {
    clients: 0,
    running: 0,
    newest: None,
});
static CHANGED: Condvar = Condvar::new();

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes the last drop of a Mooncake store hand its teardown (`destroy`) to a thread of its own
/// instead of waiting for it, for a process that ends soon after through
/// [`wait_for_teardowns`] and an `_exit` of its own (the CLI). Without it a drop destroys the
/// handle before returning, which is what an embedding process that may exit at any time needs.
pub fn defer_teardowns() {
    DEFER.store(true, Ordering::SeqCst);
}

/// Waits, at most `linger`, until every Mooncake client has been dropped, then until no
/// teardown runs, at most until `grace` after the newest one began (a teardown begun early,
/// while the command still worked, needs no more waiting at the end); whether none runs.
///
/// `destroy` removes the client's metadata entries within milliseconds of starting and then only
/// waits for the library's handshake listener thread, so a short `grace` loses nothing; a client
/// still held (a thread finishing a call its caller gave up on) is worth `linger`, so its entry
/// goes too.
pub fn wait_for_teardowns(linger: Duration, grace: Duration) -> bool {
    let mut s = state();
    let linger_until = Instant::now() + linger;
    while s.clients > 0 {
        let left = linger_until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            tracing::debug!(
                clients = s.clients,
                "mooncake: a client is still held after {linger:?}; not waiting for its teardown"
            );
            break;
        }
        s = CHANGED
            .wait_timeout(s, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    let deadline = s.newest.unwrap_or_else(Instant::now) + grace;
    while s.running > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        s = CHANGED
            .wait_timeout(s, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    true
}

/// A client was set up.
pub(super) fn opened() {
    state().clients += 1;
}

/// Tears a dropped client down with `f`: here, or on its own thread after [`defer_teardowns`].
pub(super) fn run(f: impl FnOnce() + Send + 'static) {
    let defer = DEFER.load(Ordering::SeqCst);
    {
        // One update: `wait_for_teardowns` never sees the client gone before its teardown is
        // counted.
        let mut s = state();
        s.clients = s.clients.saturating_sub(1);
        if defer {
            s.running += 1;
            s.newest = Some(Instant::now());
        }
    }
    CHANGED.notify_all();
    if !defer {
        return f();
    }
    let spawned = std::thread::Builder::new()
        .name("mooncake-teardown".into())
        .spawn(move || {
            f();
            state().running -= 1;
            CHANGED.notify_all();
        });
    if let Err(e) = spawned {
        // The closure was dropped with the failed spawn; nothing runs: the process exit
        // reclaims the handle.
        tracing::debug!("mooncake: cannot start a teardown thread ({e}); leaving it to exit");
        state().running -= 1;
    }
}
