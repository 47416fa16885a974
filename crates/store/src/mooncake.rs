//! The Mooncake Store backend, over Mooncake's C ABI (`mooncake-sys`, loaded at run time).
//!
//! - Configuration is explicit: every setting goes to `mooncake_store_setup` as an argument;
//!   nothing is written to the process environment.
//! - Before setup the master's TCP port (and an HTTP metadata server's) is probed, so a dead master
//!   fails in seconds with a message saying what to check, instead of setup's ~90 s hang.
//! - jitship is a pure client (`global_segment_size = 0`): objects it writes live on store nodes
//!   and survive its exit.
//! - Staging buffers are allocated and registered lazily, sized to the work: a buffer is made when
//!   a call needs one and none that fits is free, rounded up to a power of two between 8 MiB and
//!   `staging_buffer_size`; at most `staging_buffers` exist at once, so staging memory is bounded
//!   by `staging_buffers x staging_buffer_size` and a small tree registers one 8 MiB buffer. Values are
//!   copied into one and moved with `put_from` / `batch_put_from` / `get_into` /
//!   `batch_get_into`. A value larger than `staging_buffer_size` is refused (`TooLarge`);
//!   `max_value_size()` is that size. A get whose value is bigger than the buffer it tried asks
//!   for the size and reads again with a big enough buffer.
//! - Teardown: `destroy` removes the client's metadata entries within milliseconds, then waits up
//!   to 1 s for the library's handshake listener thread to notice (it polls `accept` with a 1 s
//!   timeout). A CLI process that called [`defer_teardown_to_exit`] does not wait for that: the
//!   last drop hands the teardown to a thread and [`exit`] ends the process once it is done or
//!   after [`TEARDOWN_GRACE`] (nothing is in flight then: every call has returned). A client
//!   still held at exit, by a thread finishing a call the command stopped waiting for (a
//!   deadline, a signal), is waited for at most [`CLIENT_LINGER`], so its entry goes too.
//! - Every call runs on its own thread and the caller waits at most `call_timeout`; a call the
//!   library never returns from is reported as `StoreError::Timeout`, and its thread keeps the
//!   handle (and its buffer) alive until the library lets go, so nothing is freed under it.
//! - Return codes become typed errors: RPC_FAIL (-900) `MasterDown`, TRANSFER_FAIL (-800)
//!   `NodeDown`, NO_AVAILABLE_HANDLE (-200) `NoSpace`, OBJECT_HAS_LEASE (-706) `Leased`,
//!   OBJECT_NOT_FOUND (-704) a miss.
//! - Immutable put: Mooncake keeps the old value of an existing key and reports success (or
//!   OBJECT_ALREADY_EXISTS, taken as success), which is the store contract. No listing.
//!
//! Size: one file on purpose. The unsafe rules of the FFI (a staging buffer stays registered and
//! leased until the call that uses it has returned; every call runs on a thread of its own; the
//! handle is destroyed only after the last call) span the buffer pool, the calls and the teardown,
//! and each SAFETY comment leans on the others; kept together they are reviewed together.

use std::ffi::{CString, c_int, c_void};
use std::net::{TcpStream, ToSocketAddrs};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use mooncake_sys as sys;

use super::{Fetched, Store, StoreError, StoreResult, ValueClass, check_key};
use crate::settings::{MooncakeConfig, parse_host_port};

/// Staging buffers are page aligned (RDMA registration works on pages).
const BUFFER_ALIGN: usize = 4096;
/// The smallest staging buffer made: heads, records and manifests of up to about 40,000 files
/// share it. Registering costs one metadata round trip whatever the size and the mapping is lazy
/// (pages cost memory once a value fills them), so a size that fits a big manifest saves an
/// install its second registration, and the failed first get, for no memory.
const MIN_STAGING: usize = 8 << 20;
/// Most keys one `batch_get_into` asks for (each gets an equal slot of one staging buffer).
const GET_BATCH: usize = 64;
/// Calls stuck in the library beyond this many make new calls fail at once instead of piling up
/// threads.
const MAX_STUCK_CALLS: usize = 64;

pub struct MooncakeStore {
    inner: Arc<Inner>,
    master: String,
    call_timeout: Duration,
    limit: u64,
}

impl std::fmt::Debug for MooncakeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MooncakeStore")
            .field("master", &self.master)
            .field("library", &self.inner.lib.path)
            .field("staging_buffer_size", &self.limit)
            .finish()
    }
}

/// The client handle. Mooncake's client object is thread safe (one handle is shared by all threads
/// of a process in Mooncake's own bindings), so sharing the pointer is sound.
struct Handle(sys::mooncake_store_t);
// SAFETY: see above; the pointer is only passed to the library, which synchronizes internally.
unsafe impl Send for Handle {}
// SAFETY: as for Send.
unsafe impl Sync for Handle {}

/// One page-aligned staging buffer, registered with the client while it is in the pool.
///
/// An anonymous mapping (`memmap2`) rather than `std::alloc::alloc_zeroed`: for an alignment above
/// the allocator's minimum, `alloc_zeroed` writes zeros over the whole buffer, which made every
/// byte of every staging buffer resident at start (4 x 64 MiB for any command). Anonymous pages
/// are zero and cost nothing until touched, so only the bytes a call moves become resident (RDMA
/// registration still pins the whole buffer, which is why buffers are also sized to the work).
struct Staging {
    map: memmap2::MmapMut,
    /// The mapping's address, taken once with exclusive access: what the library writes through.
    ptr: NonNull<u8>,
}
// SAFETY: the buffer is plain memory owned by exactly one holder at a time (the pool or a lease).
unsafe impl Send for Staging {}
// SAFETY: shared only through `Arc<Lease>` by the values one finished `batch_get_into` left in it
// (`LeasedValue`), which only read; no call writes into a buffer while its lease is shared.
unsafe impl Sync for Staging {}

impl Staging {
    fn map(len: usize) -> StoreResult<Self> {
        let mut map = memmap2::MmapMut::map_anon(len).map_err(|e| {
            StoreError::Other(format!("cannot map a staging buffer of {len} bytes: {e}"))
        })?;
        let ptr = NonNull::new(map.as_mut_ptr()).ok_or_else(|| {
            StoreError::Other(format!("cannot map a staging buffer of {len} bytes"))
        })?;
        Ok(Self { map, ptr })
    }

    fn as_mut_ptr(&self) -> *mut c_void {
        self.ptr.as_ptr().cast()
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    /// The first `n` bytes, `n <= len`.
    fn bytes(&self, n: usize) -> &[u8] {
        &self.map[..n.min(self.map.len())]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map[..]
    }
}

/// What a call needs from the pool.
#[derive(Clone, Copy, Debug)]
enum Need {
    /// A buffer of at least this many bytes (at most the configured buffer size).
    AtLeast(usize),
    /// Any buffer, the larger the better (a get of a value of unknown size).
    Any,
}

/// The staging buffers: made on demand, at most `max_buffers`, each at most `max_size` bytes.
struct Pool {
    state: Mutex<PoolState>,
    returned: Condvar,
    max_buffers: usize,
    max_size: usize,
}

struct PoolState {
    /// Registered buffers no call holds.
    free: Vec<Staging>,
    /// Buffers that exist (free, leased, or being made): at most `max_buffers`.
    count: usize,
    /// Bytes of all existing buffers, for `registered_staging_bytes`.
    bytes: usize,
}

impl Pool {
    /// The size of a new buffer for `need`: a power of two between MIN_STAGING and `max_size`, so
    /// a growing workload re-registers a few times at most.
    fn size_for(&self, need: Need) -> usize {
        let n = match need {
            Need::AtLeast(n) => n,
            Need::Any => 0,
        };
        n.max(MIN_STAGING)
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX)
            .min(self.max_size)
    }
}

struct Inner {
    lib: Arc<sys::MooncakeLib>,
    handle: Handle,
    pool: Pool,
    replica_num: usize,
    soft_pin: bool,
    soft_pin_catalog: bool,
    hard_pin: bool,
    master: String,
    /// Calls whose thread is still inside the library.
    in_flight: AtomicUsize,
}

impl Inner {
    /// Takes a staging buffer for `need`, making or growing one when none that fits is free,
    /// waiting at most `timeout` for one to come back when `max_buffers` are leased.
    fn lease(self: &Arc<Self>, need: Need, timeout: Duration) -> StoreResult<Lease> {
        let deadline = Instant::now() + timeout;
        let fits = |b: &Staging| match need {
            Need::AtLeast(n) => b.len() >= n,
            Need::Any => true,
        };
        let mut state = self.pool.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            // A free buffer that fits: the smallest such for a known size, the largest for a get.
            let pick = match need {
                Need::AtLeast(_) => state
                    .free
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| fits(b))
                    .min_by_key(|(_, b)| b.len()),
                Need::Any => state.free.iter().enumerate().max_by_key(|(_, b)| b.len()),
            }
            .map(|(i, _)| i);
            if let Some(i) = pick {
                let buf = state.free.swap_remove(i);
                return Ok(self.leased(buf));
            }
            // None fits: make one if under the bound, else replace a free one that is too small.
            let replace = if state.count < self.pool.max_buffers {
                state.count += 1;
                Some(None)
            } else if !state.free.is_empty() {
                let i = (0..state.free.len())
                    .max_by_key(|&i| state.free[i].len())
                    .unwrap_or(0);
                Some(Some(state.free.swap_remove(i)))
            } else {
                None
            };
            if let Some(old) = replace {
                let size = self.pool.size_for(need);
                if let Some(old) = &old {
                    state.bytes -= old.len();
                }
                state.bytes += size;
                drop(state);
                if let Some(old) = old {
                    self.unregister(&old);
                }
                return match self.register(size) {
                    Ok(buf) => Ok(self.leased(buf)),
                    Err(e) => {
                        let mut state = self.pool.state.lock().unwrap_or_else(|e| e.into_inner());
                        state.count -= 1;
                        state.bytes -= size;
                        self.pool.returned.notify_one();
                        Err(e)
                    }
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(StoreError::Timeout(timeout));
            }
            state = self
                .pool
                .returned
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn leased(self: &Arc<Self>, buf: Staging) -> Lease {
        Lease {
            inner: self.clone(),
            buf: Some(buf),
        }
    }

    /// Maps and registers a buffer of `size` bytes.
    fn register(&self, size: usize) -> StoreResult<Staging> {
        let buf = Staging::map(size)?;
        // SAFETY: the buffer is `size` bytes and stays mapped until it is unregistered (in
        // `unregister` or the teardown).
        let rc = unsafe { (self.lib.register_buffer)(self.handle.0, buf.as_mut_ptr(), size) };
        if rc != 0 {
            return Err(StoreError::Other(format!(
                "registering a staging buffer of {size} bytes failed ({rc})"
            )));
        }
        tracing::debug!(bytes = size, "mooncake: registered a staging buffer");
        Ok(buf)
    }

    fn unregister(&self, buf: &Staging) {
        // SAFETY: the buffer was registered with this live handle and no call uses it (it is
        // owned here, out of the pool).
        unsafe { (self.lib.unregister_buffer)(self.handle.0, buf.as_mut_ptr()) };
    }

    /// Whether a value of `class` is soft-pinned: everything with `soft_pin`, records with
    /// `soft_pin_catalog`.
    fn soft_pinned(&self, class: ValueClass) -> bool {
        self.soft_pin || (self.soft_pin_catalog && class == ValueClass::Record)
    }

    fn replicate_config(&self, soft_pin: bool) -> sys::mooncake_replicate_config {
        sys::mooncake_replicate_config {
            replica_num: self.replica_num,
            with_soft_pin: c_int::from(soft_pin),
            with_hard_pin: c_int::from(self.hard_pin),
            preferred_segments: std::ptr::null(),
            preferred_segments_count: 0,
        }
    }

    /// What a negative code means, for an operation on `key`.
    fn error(&self, code: i64, op: &str, key: &str) -> StoreError {
        let name = sys::code_name(code);
        match code {
            sys::RPC_FAIL => StoreError::MasterDown(format!(
                "{op} {key}: the master {} did not answer ({name} {code}); is mooncake_master running and reachable?",
                self.master
            )),
            sys::TRANSFER_FAIL => StoreError::NodeDown(format!(
                "{op} {key}: the store node holding the object did not answer ({name} {code}); are the mooncake_client store nodes up?"
            )),
            sys::NO_AVAILABLE_HANDLE => StoreError::NoSpace(format!(
                "{op} {key}: no store node has room ({name} {code}); add store nodes or segment space, or unpin objects"
            )),
            sys::OBJECT_HAS_LEASE => StoreError::Leased(key.to_owned()),
            sys::INVALID_KEY => StoreError::InvalidKey(key.to_owned()),
            _ => StoreError::Other(format!("{op} {key}: Mooncake returned {code} ({name})")),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Every lease holds an Arc<Inner>, so all buffers are back in the pool by now, and every
        // call has returned (each holds an Arc<Inner> while inside the library).
        let buffers = std::mem::take(
            &mut self
                .pool
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .free,
        );
        let lib = self.lib.clone();
        let handle = Handle(self.handle.0);
        let teardown = move || {
            let handle = handle; // the whole Handle (Send), not its raw pointer field
            for buf in &buffers {
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

/// How long after the newest Mooncake teardown began [`exit`] waits for those still running.
/// `destroy` removes the client's metadata entries within milliseconds of starting (measured:
/// under 15 ms on a loaded 2-core machine) and then only waits for the library's listener thread;
/// past this, the process ends without waiting for that.
pub const TEARDOWN_GRACE: Duration = Duration::from_millis(50);

static DEFER_TEARDOWN: AtomicBool = AtomicBool::new(false);

/// Makes the last drop of a Mooncake store hand `destroy` to a thread instead of waiting for it,
/// for a process that ends through [`exit`] (the CLI). Without it a drop destroys the handle
/// before returning, which is what an embedding process that may exit at any time needs.
pub fn defer_teardown_to_exit() {
    DEFER_TEARDOWN.store(true, Ordering::SeqCst);
}

/// Longest [`exit`] waits for a client still held by a thread that is finishing its last call
/// after the command gave up on it (an install stopped by its deadline or by SIGTERM), so that
/// its teardown still removes its metadata entry. A call stuck in the library for longer (up to
/// `call_timeout`) is not waited for.
pub const CLIENT_LINGER: Duration = Duration::from_secs(1);

/// Ends the process with `code` once every Mooncake client is dropped (at most [`CLIENT_LINGER`])
/// and the teardowns begun by those drops are done, or [`TEARDOWN_GRACE`] after the newest began,
/// with `_exit` after flushing stdout, stderr and C stdio. Why not
/// `std::process::exit`: exit handlers and the library's static destructors must not run while a
/// teardown thread is still inside `destroy` (that race aborted CLI processes with "double free or
/// corruption" before commit edacd18), and even after it they took 0.5 s of a 1.2 s command
/// (measured on the loaded 2-core build machine) tearing down what the kernel frees anyway.
/// Nothing is lost: by now every store call has returned (puts are synchronous) and every Rust
/// value of the command has been dropped; the kernel frees the memory and closes the sockets.
pub fn exit(code: i32) -> ! {
    if !teardown::wait(CLIENT_LINGER, TEARDOWN_GRACE) {
        tracing::debug!(
            "mooncake: teardown still running after {TEARDOWN_GRACE:?} (the library's listener thread); exiting"
        );
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: fflush(NULL) flushes every C stdio stream; _exit ends the process at once, and
    // nothing of this process runs after it.
    unsafe {
        libc::fflush(std::ptr::null_mut());
        libc::_exit(code)
    }
}

mod teardown {
    use std::sync::{Condvar, Mutex};
    use std::time::{Duration, Instant};

    use super::{DEFER_TEARDOWN, Ordering};

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

    fn state() -> std::sync::MutexGuard<'static, State> {
        STATE.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A client was set up.
    pub(super) fn opened() {
        state().clients += 1;
    }

    /// Tears a dropped client down with `f`: here, or on its own thread when the process ends
    /// through `super::exit`.
    pub(super) fn run(f: impl FnOnce() + Send + 'static) {
        let defer = DEFER_TEARDOWN.load(Ordering::SeqCst);
        {
            // One update: `wait` never sees the client gone before its teardown is counted.
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

    /// Waits, at most `linger`, until every client has been dropped, then until no teardown
    /// runs, at most until `grace` after the newest one began (a teardown begun early, while the
    /// command still worked, needs no more waiting at the end); whether none runs.
    pub(super) fn wait(linger: Duration, grace: Duration) -> bool {
        let mut s = state();
        let linger_until = Instant::now() + linger;
        while s.clients > 0 {
            let left = linger_until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::debug!(
                    clients = s.clients,
                    "mooncake: a client is still held after {linger:?}; exiting without its teardown"
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
}

/// A staging buffer taken from the pool; goes back when dropped (on whichever thread).
struct Lease {
    inner: Arc<Inner>,
    buf: Option<Staging>,
}

impl Lease {
    fn buf(&self) -> &Staging {
        self.buf
            .as_ref()
            .expect("a lease holds its buffer until dropped")
    }

    fn buf_mut(&mut self) -> &mut Staging {
        self.buf
            .as_mut()
            .expect("a lease holds its buffer until dropped")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.inner
                .pool
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .free
                .push(buf);
            self.inner.pool.returned.notify_one();
        }
    }
}

/// One value of a `get_sized_batch`, read in place from the staging buffer it was fetched into;
/// the buffer goes back to the pool when the last value of its batch is dropped.
struct LeasedValue {
    lease: Arc<Lease>,
    at: usize,
    len: usize,
}

impl AsRef<[u8]> for LeasedValue {
    fn as_ref(&self) -> &[u8] {
        &self.lease.buf().bytes(self.at + self.len)[self.at..]
    }
}

/// Counts a call as in flight for as long as it lives.
struct InFlight(Arc<Inner>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn c_key(key: &str) -> StoreResult<CString> {
    check_key(key)?;
    CString::new(key).map_err(|_| StoreError::InvalidKey(key.to_owned()))
}

fn c_arg(what: &str, value: &str) -> StoreResult<CString> {
    CString::new(value)
        .map_err(|_| StoreError::Other(format!("{what} {value:?} contains a NUL byte")))
}

/// Connects to `addr` within `timeout`, trying each address it resolves to.
fn probe(addr: &str, timeout: Duration) -> Result<(), String> {
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?
        .collect();
    let mut last = format!("{addr} resolves to no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    Err(last)
}

impl MooncakeStore {
    /// Loads the library, probes the master, sets up a pure client and registers the staging
    /// buffers. Fails within about `probe_timeout` when the master is unreachable.
    pub fn connect(config: &MooncakeConfig) -> StoreResult<Self> {
        config
            .validate()
            .map_err(|e| StoreError::Other(e.to_string()))?;
        let path = config
            .library_path()
            .map_err(|e| StoreError::Other(e.to_string()))?;
        // SAFETY: the operator configured this path as libmooncake_store.so (store_c.h); loading
        // it runs its initializers, which is what the library expects.
        let lib = unsafe { sys::MooncakeLib::load(&path) }
            .map_err(|e| StoreError::Other(e.to_string()))?;
        tracing::debug!(library = %path.display(), "mooncake: library loaded");

        let secs = config.probe_timeout.as_secs_f64();
        probe(&config.master, config.probe_timeout).map_err(|e| {
            StoreError::MasterDown(format!(
                "master {} unreachable (probe of {secs:.1} s: {e}); is mooncake_master running? check store.mooncake.master",
                config.master
            ))
        })?;
        if let Some(rest) = config.metadata_server.strip_prefix("http://") {
            let host_port = rest.split('/').next().unwrap_or(rest);
            if parse_host_port(host_port).is_some() {
                probe(host_port, config.probe_timeout).map_err(|e| {
                    StoreError::Unavailable(format!(
                        "metadata server {} unreachable (probe of {secs:.1} s: {e}); is the master's HTTP metadata server enabled \
                         (--enable_http_metadata_server)? check store.mooncake.metadata_server",
                        config.metadata_server
                    ))
                })?;
            }
        }

        let hostname = match &config.local_hostname {
            Some(h) => h.clone(),
            None => gethostname::gethostname().to_string_lossy().into_owned(),
        };
        let devices = config.rdma_devices.join(",");
        let args = [
            c_arg("local hostname", &hostname)?,
            c_arg("metadata server", &config.metadata_server)?,
            c_arg("protocol", config.protocol.as_str())?,
            c_arg("rdma devices", &devices)?,
            c_arg("master", &config.master)?,
        ];
        tracing::debug!("mooncake: master and metadata server answer the probe");
        // SAFETY: create takes no arguments and returns a new handle or NULL.
        let raw = unsafe { (lib.create)() };
        if raw.is_null() {
            return Err(StoreError::Other(format!(
                "mooncake_store_create in {} returned NULL",
                path.display()
            )));
        }
        let handle = Handle(raw);
        let local_buffer = config.local_buffer_size.as_u64();

        // Setup can block for a long time (the master answers the probe but not RPCs); it runs on
        // its own thread, and if we stop waiting, that thread destroys the handle when done.
        let (tx, rx) = mpsc::sync_channel::<(i32, Handle)>(1);
        let setup_lib = lib.clone();
        std::thread::Builder::new()
            .name("mooncake-setup".into())
            .spawn(move || {
                let [host, meta, proto, dev, master] = &args;
                // SAFETY: the handle is fresh from create; every string is NUL-terminated and
                // outlives the call (the library copies what it keeps).
                let rc = unsafe {
                    (setup_lib.setup)(
                        handle.0,
                        host.as_ptr(),
                        meta.as_ptr(),
                        0,
                        local_buffer,
                        proto.as_ptr(),
                        dev.as_ptr(),
                        master.as_ptr(),
                    )
                };
                if let Err(mpsc::SendError((_, handle))) = tx.send((rc, handle)) {
                    // SAFETY: nobody else has the handle: the caller gave up on it.
                    unsafe { (setup_lib.destroy)(handle.0) };
                }
            })
            .map_err(|e| StoreError::Other(format!("cannot start the setup thread: {e}")))?;
        let (rc, handle) = match rx.recv_timeout(config.setup_timeout) {
            Ok(r) => r,
            Err(_) => {
                return Err(StoreError::MasterDown(format!(
                    "Mooncake setup with master {} did not finish within {:?}; check that the master answers and that the \
                     metadata server {} is reachable",
                    config.master, config.setup_timeout, config.metadata_server
                )));
            }
        };
        if rc != 0 {
            // SAFETY: setup failed; the handle is ours alone.
            unsafe { (lib.destroy)(handle.0) };
            return Err(StoreError::Unavailable(format!(
                "Mooncake setup failed ({rc}) with master {}, metadata server {}, protocol {}, local hostname {hostname}: check \
                 that they are reachable from this host; on a network without a routable address Mooncake needs \
                 MC_TCP_BIND_ADDRESS=127.0.0.1 in its environment; its log on stderr says more",
                config.master,
                config.metadata_server,
                config.protocol.as_str()
            )));
        }

        tracing::debug!("mooncake: client set up");
        // No staging buffer yet: calls make them as they need them (see the module docs).
        let size = config.staging_buffer_size.as_u64() as usize;
        let inner = Inner {
            lib,
            handle,
            pool: Pool {
                state: Mutex::new(PoolState {
                    free: Vec::new(),
                    count: 0,
                    bytes: 0,
                }),
                returned: Condvar::new(),
                max_buffers: config.staging_buffers,
                max_size: size,
            },
            replica_num: config.replicas as usize,
            soft_pin: config.soft_pin,
            soft_pin_catalog: config.soft_pin_catalog,
            hard_pin: config.hard_pin,
            master: config.master.clone(),
            in_flight: AtomicUsize::new(0),
        };
        teardown::opened();
        Ok(Self {
            inner: Arc::new(inner),
            master: config.master.clone(),
            call_timeout: config.call_timeout,
            limit: size as u64,
        })
    }

    /// Bytes of staging buffers that exist now (registered with the library): grows with the
    /// largest values moved and the calls in flight at once, bounded by `staging_buffers x
    /// staging_buffer_size`.
    pub fn registered_staging_bytes(&self) -> u64 {
        self.inner
            .pool
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .bytes as u64
    }

    /// Takes a staging buffer for `need`, waiting at most `call_timeout` for one.
    fn lease(&self, need: Need) -> StoreResult<Lease> {
        self.inner.lease(need, self.call_timeout)
    }

    /// Runs `f` on its own thread and waits at most `call_timeout` for it.
    fn call<T: Send + 'static>(
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

    fn check_size(&self, len: usize) -> StoreResult<()> {
        if len as u64 > self.limit {
            return Err(StoreError::TooLarge {
                size: len as u64,
                limit: self.limit,
            });
        }
        if len == 0 {
            return Err(StoreError::Other(
                "Mooncake cannot store an empty value".into(),
            ));
        }
        Ok(())
    }

    /// Puts `items` (all valid and fitting one buffer each), packing as many as fit into one
    /// staging buffer per `batch_put_from`.
    fn put_group(
        &self,
        items: &[(usize, CString, &[u8])],
        soft_pin: bool,
        results: &mut [StoreResult<()>],
    ) {
        let mut start = 0;
        while start < items.len() {
            // A buffer for what is left, as packed below, up to one full buffer.
            let left = items[start..]
                .iter()
                .fold(0usize, |at, (_, _, v)| at.next_multiple_of(64) + v.len())
                .min(self.limit as usize);
            let mut lease = match self.lease(Need::AtLeast(left)) {
                Ok(l) => l,
                Err(e) => {
                    for (i, _, _) in &items[start..] {
                        results[*i] = Err(e.clone());
                    }
                    return;
                }
            };
            // Fill the buffer with consecutive items.
            let mut offsets = Vec::new();
            let mut used = 0usize;
            let mut end = start;
            {
                let buf = lease.buf_mut().bytes_mut();
                while end < items.len() {
                    let v = items[end].2;
                    let at = used.next_multiple_of(64);
                    if at + v.len() > buf.len() {
                        break;
                    }
                    buf[at..at + v.len()].copy_from_slice(v);
                    offsets.push((at, v.len()));
                    used = at + v.len();
                    end += 1;
                }
            }
            let keys: Vec<CString> = items[start..end]
                .iter()
                .map(|(_, k, _)| k.clone())
                .collect();
            let r = self.call(move |inner| {
                let base = lease.buf().as_mut_ptr().cast::<u8>();
                let key_ptrs: Vec<*const std::ffi::c_char> =
                    keys.iter().map(|k| k.as_ptr()).collect();
                // SAFETY: each (offset, len) lies inside the leased buffer (checked when filling).
                let mut bufs: Vec<*mut c_void> = offsets
                    .iter()
                    .map(|(at, _)| unsafe { base.add(*at) }.cast())
                    .collect();
                let sizes: Vec<usize> = offsets.iter().map(|(_, len)| *len).collect();
                let mut out: Vec<c_int> = vec![0; keys.len()];
                let cfg = inner.replicate_config(soft_pin);
                // SAFETY: all arrays have `keys.len()` entries; the buffers are registered and held
                // by this thread's lease until the call returns; keys are NUL-terminated.
                let rc = unsafe {
                    (inner.lib.batch_put_from)(
                        inner.handle.0,
                        key_ptrs.as_ptr(),
                        bufs.as_mut_ptr(),
                        sizes.as_ptr(),
                        keys.len(),
                        &cfg,
                        out.as_mut_ptr(),
                    )
                };
                let results: Vec<StoreResult<()>> = keys
                    .iter()
                    .zip(&out)
                    .map(|(k, &code)| {
                        let code = if rc < 0 {
                            i64::from(rc)
                        } else {
                            i64::from(code)
                        };
                        put_result(inner, code, &k.to_string_lossy())
                    })
                    .collect();
                drop(lease);
                results
            });
            match r {
                Ok(rs) => {
                    for ((i, _, _), r) in items[start..end].iter().zip(rs) {
                        results[*i] = r;
                    }
                }
                Err(e) => {
                    for (i, _, _) in &items[start..end] {
                        results[*i] = Err(e.clone());
                    }
                }
            }
            start = end;
        }
    }
}

fn put_result(inner: &Inner, code: i64, key: &str) -> StoreResult<()> {
    match code {
        // An existing key keeps its old value: that is the immutable put of the contract.
        c if c >= 0 || c == sys::OBJECT_ALREADY_EXISTS => Ok(()),
        c => Err(inner.error(c, "put", key)),
    }
}

/// One `batch_get_into` of `keys` into the leased buffer, key i at `offsets[i]` with room for
/// `sizes[i]` bytes: the call's code and each key's result (bytes read or a negative code).
///
/// Panics unless every `offsets[i] + sizes[i]` lies inside the buffer (the callers pack them so).
fn batch_get_into(
    inner: &Inner,
    lease: &Lease,
    keys: &[CString],
    offsets: &[usize],
    sizes: &[usize],
) -> (c_int, Vec<i64>) {
    let buf = lease.buf();
    assert!(keys.len() == offsets.len() && keys.len() == sizes.len());
    assert!(offsets.iter().zip(sizes).all(|(o, n)| o + n <= buf.len()));
    let base = buf.as_mut_ptr().cast::<u8>();
    let key_ptrs: Vec<*const std::ffi::c_char> = keys.iter().map(|k| k.as_ptr()).collect();
    // SAFETY: every offset lies inside the buffer (asserted above).
    let mut bufs: Vec<*mut c_void> = offsets
        .iter()
        .map(|&o| unsafe { base.add(o) }.cast())
        .collect();
    let mut out = vec![0i64; keys.len()];
    // SAFETY: arrays of keys.len() entries; the registered buffer is held by the lease for the
    // call and every slot fits in it; keys are NUL-terminated.
    let rc = unsafe {
        (inner.lib.batch_get_into)(
            inner.handle.0,
            key_ptrs.as_ptr(),
            bufs.as_mut_ptr(),
            sizes.as_ptr(),
            keys.len(),
            out.as_mut_ptr(),
        )
    };
    (rc, out)
}

/// What one `get_into` with a leased buffer found.
enum GetOnce {
    Done(StoreResult<Option<Vec<u8>>>),
    /// The value is this many bytes, more than the buffer tried.
    Bigger(u64),
}

/// One `get_into` with the whole leased buffer: the value copied out, a miss, or the size of a
/// value too big for this buffer. A value over `limit` is refused before it is copied out.
fn get_once(inner: &Inner, lease: &Lease, key: &CString, limit: u64) -> GetOnce {
    let buf = lease.buf();
    // SAFETY: the buffer is registered, `buf.len()` bytes, and held by this lease for the call.
    let n =
        unsafe { (inner.lib.get_into)(inner.handle.0, key.as_ptr(), buf.as_mut_ptr(), buf.len()) };
    if n >= 0 && n as u64 > limit {
        return GetOnce::Done(Err(StoreError::TooLarge {
            size: n as u64,
            limit,
        }));
    }
    get_result(inner, n, key, buf)
}

fn get_result(inner: &Inner, n: i64, key: &CString, buf: &Staging) -> GetOnce {
    let k = key.to_string_lossy();
    match n {
        n if n >= 0 => GetOnce::Done(Ok(Some(buf.bytes(n as usize).to_vec()))),
        // Not stored, evicted, removed, or still being written by someone: a miss.
        sys::OBJECT_NOT_FOUND | sys::REPLICA_IS_NOT_READY => GetOnce::Done(Ok(None)),
        sys::INVALID_PARAMS | sys::BUFFER_OVERFLOW => {
            // SAFETY: key is NUL-terminated; get_size only reads metadata.
            let size = unsafe { (inner.lib.get_size)(inner.handle.0, key.as_ptr()) };
            match size {
                s if s > 0 && s as u64 > buf.len() as u64 => GetOnce::Bigger(s as u64),
                // Gone since the read: a miss like any other.
                sys::OBJECT_NOT_FOUND => GetOnce::Done(Ok(None)),
                _ => GetOnce::Done(Err(inner.error(n, "get", &k))),
            }
        }
        n => GetOnce::Done(Err(inner.error(n, "get", &k))),
    }
}

impl Store for MooncakeStore {
    fn describe(&self) -> String {
        format!("mooncake:{}", self.master)
    }

    fn max_value_size(&self) -> u64 {
        self.limit
    }

    fn put(&self, key: &str, value: &[u8], class: ValueClass) -> StoreResult<()> {
        self.put_filled(key, value.len(), class, &mut |buf| {
            buf.copy_from_slice(value);
            true
        })
        .map(|_| ())
    }

    /// Fills a leased staging buffer in place and puts it from there.
    fn put_filled(
        &self,
        key: &str,
        len: usize,
        class: ValueClass,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> StoreResult<bool> {
        let k = c_key(key)?;
        self.check_size(len)?;
        let mut lease = self.lease(Need::AtLeast(len))?;
        if !fill(&mut lease.buf_mut().bytes_mut()[..len]) {
            return Ok(false);
        }
        self.call(move |inner| {
            let cfg = inner.replicate_config(inner.soft_pinned(class));
            // SAFETY: the registered buffer holds `len` bytes of the value and is held by this
            // thread's lease until the call returns; the key is NUL-terminated.
            let rc = unsafe {
                (inner.lib.put_from)(
                    inner.handle.0,
                    k.as_ptr(),
                    lease.buf().as_mut_ptr(),
                    len,
                    &cfg,
                )
            };
            put_result(inner, i64::from(rc), &k.to_string_lossy()).map(|()| true)
        })?
    }

    fn get(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
        self.get_capped(key, self.limit)
    }

    /// A value over `limit` is refused from the size the first read reports, before a buffer
    /// that could hold it is made; one that fits the first buffer is refused before it is copied
    /// out of that (registered) buffer, so the heap never holds it.
    fn get_capped(&self, key: &str, limit: u64) -> StoreResult<Option<Vec<u8>>> {
        let limit = limit.min(self.limit);
        let k = c_key(key)?;
        // The size is unknown: try the largest free buffer (or a small new one), then, if the
        // value is bigger, one that fits it.
        let lease = self.lease(Need::Any)?;
        let key2 = k.clone();
        let size = match self.call(move |inner| get_once(inner, &lease, &key2, limit))? {
            GetOnce::Done(r) => return r,
            GetOnce::Bigger(size) => size,
        };
        if size > limit {
            return Err(StoreError::TooLarge { size, limit });
        }
        let lease = self.lease(Need::AtLeast(size as usize))?;
        match self.call(move |inner| get_once(inner, &lease, &k, limit))? {
            GetOnce::Done(r) => r,
            // Removed and written again bigger in between (puts do not overwrite).
            GetOnce::Bigger(size) => Err(StoreError::Other(format!(
                "get {key}: the value changed size ({size} bytes) while it was read; retry"
            ))),
        }
    }

    fn exists(&self, key: &str) -> StoreResult<bool> {
        let k = c_key(key)?;
        self.call(move |inner| {
            // SAFETY: the key is NUL-terminated.
            let rc = unsafe { (inner.lib.is_exist)(inner.handle.0, k.as_ptr()) };
            match i64::from(rc) {
                1 => Ok(true),
                0 | sys::OBJECT_NOT_FOUND => Ok(false),
                c => Err(inner.error(c, "exists", &k.to_string_lossy())),
            }
        })?
    }

    fn remove(&self, key: &str) -> StoreResult<bool> {
        let k = c_key(key)?;
        self.call(move |inner| {
            // SAFETY: the key is NUL-terminated; force=0 respects readers' leases.
            let rc = unsafe { (inner.lib.remove)(inner.handle.0, k.as_ptr(), 0) };
            match i64::from(rc) {
                c if c >= 0 => Ok(true),
                sys::OBJECT_NOT_FOUND => Ok(false),
                c => Err(inner.error(c, "remove", &k.to_string_lossy())),
            }
        })?
    }

    fn put_batch(&self, items: &[(&str, &[u8])], class: ValueClass) -> Vec<StoreResult<()>> {
        let mut results: Vec<StoreResult<()>> = items.iter().map(|_| Ok(())).collect();
        let mut valid = Vec::with_capacity(items.len());
        for (i, (key, value)) in items.iter().enumerate() {
            match c_key(key).and_then(|k| self.check_size(value.len()).map(|()| k)) {
                Ok(k) => valid.push((i, k, *value)),
                Err(e) => results[i] = Err(e),
            }
        }
        self.put_group(&valid, self.inner.soft_pinned(class), &mut results);
        results
    }

    fn get_batch(&self, keys: &[&str]) -> Vec<StoreResult<Option<Vec<u8>>>> {
        let mut results: Vec<StoreResult<Option<Vec<u8>>>> =
            keys.iter().map(|_| Ok(None)).collect();
        let mut valid = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            match c_key(key) {
                Ok(k) => valid.push((i, k)),
                Err(e) => results[i] = Err(e),
            }
        }
        for group in valid.chunks(GET_BATCH) {
            let lease = match self.lease(Need::Any) {
                Ok(l) => l,
                Err(e) => {
                    for (i, _) in group {
                        results[*i] = Err(e.clone());
                    }
                    continue;
                }
            };
            let group_keys: Vec<CString> = group.iter().map(|(_, k)| k.clone()).collect();
            // Each key gets an equal, page-aligned slot of the buffer; values too big for their
            // slot (`None` here) are read again alone by `get`, after this lease is back.
            let r = self.call(move |inner| {
                let keys = group_keys;
                let buf = lease.buf();
                let slot = (buf.len() / keys.len()) / BUFFER_ALIGN * BUFFER_ALIGN;
                let slot = slot.max(BUFFER_ALIGN.min(buf.len()));
                let n = keys.len().min(buf.len() / slot);
                // n * slot <= buf.len(), so every slot lies inside the leased buffer.
                let offsets: Vec<usize> = (0..n).map(|i| i * slot).collect();
                let (rc, out) = batch_get_into(inner, &lease, &keys[..n], &offsets, &vec![slot; n]);
                let mut results: Vec<Option<StoreResult<Option<Vec<u8>>>>> =
                    Vec::with_capacity(keys.len());
                for (i, k) in keys.iter().enumerate() {
                    let code = if i >= n {
                        sys::INVALID_PARAMS
                    } else if rc < 0 {
                        i64::from(rc)
                    } else {
                        out[i]
                    };
                    if code >= 0 {
                        let v = buf.bytes(i * slot + code as usize)[i * slot..].to_vec();
                        results.push(Some(Ok(Some(v))));
                    } else if code == sys::INVALID_PARAMS
                        || code == sys::BUFFER_OVERFLOW
                        || (rc < 0 && code != sys::RPC_FAIL)
                    {
                        results.push(None);
                    } else {
                        results.push(match get_result(inner, code, k, buf) {
                            GetOnce::Done(r) => Some(r),
                            GetOnce::Bigger(_) => None,
                        });
                    }
                }
                drop(lease);
                results
            });
            match r {
                Ok(rs) => {
                    for ((i, _), r) in group.iter().zip(rs) {
                        results[*i] = match r {
                            Some(r) => r,
                            None => self.get(keys[*i]),
                        };
                    }
                }
                Err(e) => {
                    for (i, _) in group {
                        results[*i] = Err(e.clone());
                    }
                }
            }
        }
        results
    }

    /// Packs consecutive values at page-aligned offsets into one staging buffer per
    /// `batch_get_into` and hands them out in place (no copy into vectors). A value whose size is
    /// other than expected, or not storable here, is read alone by `get`.
    fn get_sized_batch(&self, items: &[(&str, u64)]) -> Vec<StoreResult<Option<Fetched>>> {
        let mut results: Vec<Option<StoreResult<Option<Fetched>>>> =
            items.iter().map(|_| None).collect();
        let mut valid = Vec::with_capacity(items.len());
        for (i, &(key, size)) in items.iter().enumerate() {
            match c_key(key) {
                Ok(k) if size > 0 && size <= self.limit => valid.push((i, k, size as usize)),
                Ok(_) => {}
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        let mut start = 0;
        while start < valid.len() {
            let mut offsets = Vec::new();
            let (mut end, mut used) = (start, 0usize);
            while end < valid.len() {
                let at = used.next_multiple_of(BUFFER_ALIGN);
                if end > start && at + valid[end].2 > self.limit as usize {
                    break;
                }
                offsets.push(at);
                used = at + valid[end].2;
                end += 1;
            }
            let group = &valid[start..end];
            start = end;
            let lease = match self.lease(Need::AtLeast(used)) {
                Ok(l) => l,
                Err(e) => {
                    for (i, _, _) in group {
                        results[*i] = Some(Err(e.clone()));
                    }
                    continue;
                }
            };
            let keys: Vec<CString> = group.iter().map(|(_, k, _)| k.clone()).collect();
            let sizes: Vec<usize> = group.iter().map(|(_, _, n)| *n).collect();
            let at = offsets.clone();
            let r = self.call(move |inner| {
                // offsets[i] + sizes[i] <= used <= the leased buffer's length (packed above).
                let (rc, out) = batch_get_into(inner, &lease, &keys, &at, &sizes);
                (lease, rc, out)
            });
            let (lease, rc, out) = match r {
                Ok(r) => r,
                Err(e) => {
                    for (i, _, _) in group {
                        results[*i] = Some(Err(e.clone()));
                    }
                    continue;
                }
            };
            let lease = Arc::new(lease);
            for (j, (i, k, _)) in group.iter().enumerate() {
                let code = if rc < 0 { i64::from(rc) } else { out[j] };
                results[*i] = match code {
                    n if n >= 0 => Some(Ok(Some(Fetched::new(LeasedValue {
                        lease: lease.clone(),
                        at: offsets[j],
                        len: n as usize,
                    })))),
                    sys::OBJECT_NOT_FOUND | sys::REPLICA_IS_NOT_READY => Some(Ok(None)),
                    // Bigger than expected, or the whole call refused: read alone below.
                    sys::INVALID_PARAMS | sys::BUFFER_OVERFLOW => None,
                    c if rc < 0 && c != sys::RPC_FAIL => None,
                    c => Some(Err(self.inner.error(c, "get", &k.to_string_lossy()))),
                };
            }
        }
        results
            .into_iter()
            .zip(items)
            .map(|(r, (key, _))| r.unwrap_or_else(|| Ok(self.get(key)?.map(Fetched::from))))
            .collect()
    }

    fn exists_batch(&self, keys: &[&str]) -> Vec<StoreResult<bool>> {
        let mut results: Vec<StoreResult<bool>> = keys.iter().map(|_| Ok(false)).collect();
        let mut valid = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            match c_key(key) {
                Ok(k) => valid.push((i, k)),
                Err(e) => results[i] = Err(e),
            }
        }
        for group in valid.chunks(1024) {
            let keys: Vec<CString> = group.iter().map(|(_, k)| k.clone()).collect();
            let r = self.call(move |inner| {
                let ptrs: Vec<*const std::ffi::c_char> = keys.iter().map(|k| k.as_ptr()).collect();
                let mut out: Vec<c_int> = vec![0; keys.len()];
                // SAFETY: arrays of keys.len() entries; keys NUL-terminated.
                let rc = unsafe {
                    (inner.lib.batch_is_exist)(
                        inner.handle.0,
                        ptrs.as_ptr(),
                        keys.len(),
                        out.as_mut_ptr(),
                    )
                };
                keys.iter()
                    .zip(&out)
                    .map(
                        |(k, &c)| match if rc < 0 { i64::from(rc) } else { i64::from(c) } {
                            1 => Ok(true),
                            0 | sys::OBJECT_NOT_FOUND => Ok(false),
                            c => Err(inner.error(c, "exists", &k.to_string_lossy())),
                        },
                    )
                    .collect::<Vec<_>>()
            });
            match r {
                Ok(rs) => {
                    for ((i, _), r) in group.iter().zip(rs) {
                        results[*i] = r;
                    }
                }
                Err(e) => {
                    for (i, _) in group {
                        results[*i] = Err(e.clone());
                    }
                }
            }
        }
        results
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn missing_library_is_a_clear_error() {
        let config = MooncakeConfig {
            library: Some(PathBuf::from("/nowhere/libmooncake_store.so")),
            ..Default::default()
        };
        let err = MooncakeStore::connect(&config).unwrap_err().to_string();
        assert!(
            err.contains("/nowhere/libmooncake_store.so") && err.contains("store.mooncake.library"),
            "{err}"
        );
    }

    #[test]
    fn unreachable_port_fails_the_probe_fast() {
        // A port nobody listens on: bind one, note it, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let started = Instant::now();
        let err = probe(&format!("127.0.0.1:{port}"), Duration::from_secs(2)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3), "{err}");
    }
}
