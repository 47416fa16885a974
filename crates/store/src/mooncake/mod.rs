//! The Mooncake Store backend, over Mooncake's C ABI (`mooncake-sys`, loaded at run time).
//!
//! - `connect`: every setting goes to `mooncake_store_setup` as an argument; the master (and an
//!   HTTP metadata server) is probed first, so a dead master fails in seconds instead of setup's
//!   ~90 s hang. jitship is a pure client (`global_segment_size = 0`): objects it writes live on
//!   store nodes and survive its exit.
//! - `pool`: staging buffers are allocated and registered lazily, sized to the work: a buffer is
//!   made when a call needs one and none that fits is free, rounded up to a power of two between
//!   8 MiB and `staging_buffer_size`; at most `staging_buffers` exist at once, so staging memory is
//!   bounded by `staging_buffers x staging_buffer_size` and a small tree registers one 8 MiB
//!   buffer. Values are copied into one and moved with `put_from` / `batch_put_from` /
//!   `get_into` / `batch_get_into`. A value larger than `staging_buffer_size` is refused
//!   (`TooLarge`); `max_value_size()` is that size. A get whose value is bigger than the buffer it
//!   tried asks for the size and reads again with a big enough buffer.
//! - `call`: every call runs on its own thread and the caller waits at most `call_timeout`; a call
//!   the library never returns from is reported as `StoreError::Timeout`, and its thread keeps the
//!   handle (and its buffer) alive until the library lets go, so nothing is freed under it. The
//!   last drop of the client unregisters the buffers and `destroy`s the handle.
//! - `teardown`: `destroy` removes the client's metadata entries within milliseconds, then waits up
//!   to 1 s for the library's handshake listener thread to notice (it polls `accept` with a 1 s
//!   timeout). A process that called [`defer_teardowns`] does not wait for that: the last drop
//!   hands the teardown to a thread, and the process waits for it with [`wait_for_teardowns`]
//!   before it ends itself (the CLI: `cli::exit::end` in the engine).
//! - `batch`: batched calls pack a group of keys into one buffer and one library call and scatter
//!   the answers back per key.
//! - `codes`: return codes become typed errors (RPC_FAIL `MasterDown`, TRANSFER_FAIL `NodeDown`,
//!   NO_AVAILABLE_HANDLE `NoSpace`, OBJECT_HAS_LEASE `Leased`, OBJECT_NOT_FOUND a miss).
//! - `retry`: a call that failed with a failure that passes by itself (the master or a node not
//!   answering, replicas busy) is tried again with a jittered backoff for `retry_for`.
//! - Immutable put: Mooncake keeps the old value of an existing key and reports success (or
//!   OBJECT_ALREADY_EXISTS, taken as success), which is the store contract. No listing.
//!
//! The unsafe rules of the FFI span these modules: a staging buffer stays registered and leased
//! until the call that uses it has returned (`pool`, `call`); every call runs on a thread of its
//! own holding the client (`call`); the handle is destroyed only after the last call (`call`).

mod batch;
mod call;
mod codes;
mod connect;
mod pool;
mod retry;
mod teardown;

use std::ffi::{CString, c_int};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

use mooncake_sys as sys;

use self::call::Handle;
use self::codes::{GetOnce, exists_result, get_result, put_result, remove_result};
use self::pool::{Lease, Need, Pool};
pub use self::teardown::{defer_teardowns, wait_for_teardowns};
use crate::{Fetched, Store, StoreError, StoreResult, ValueClass, check_key};

pub struct MooncakeStore {
    inner: Arc<Inner>,
    master: String,
    call_timeout: Duration,
    limit: u64,
    /// How long a call that failed with a failure that passes by itself is tried again (`retry`).
    retry_for: Duration,
    /// Tries again so far, of every call (`retries`), and its change (`wait_for_retries`).
    retries: Mutex<u64>,
    retried: Condvar,
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

/// The client: the handle, its staging buffers and the settings every call uses. Shared by the
/// store and every call and lease in flight; dropping the last reference tears the client down
/// (`call`).
struct Inner {
    lib: Arc<sys::MooncakeLib>,
    handle: Handle,
    pool: Pool,
    replica_num: usize,
    soft_pin: bool,
    soft_pin_catalog: bool,
    hard_pin: bool,
    hard_pin_catalog: bool,
    master: String,
    /// `segments_url`, read on the first `put_copy`.
    segments_url: Option<String>,
    probe_timeout: Duration,
    /// The store nodes' segment names read from `segments_url`, sorted: copy `k` of a value kept
    /// under several keys is placed on segment `k mod n`. Empty: Mooncake places every copy
    /// itself.
    segments: OnceLock<Vec<CString>>,
    /// Calls whose thread is still inside the library.
    in_flight: AtomicUsize,
}

impl Inner {
    /// Whether a value of `class` is soft-pinned: everything with `soft_pin`, records with
    /// `soft_pin_catalog`.
    fn soft_pinned(&self, class: ValueClass) -> bool {
        self.soft_pin || (self.soft_pin_catalog && class == ValueClass::Record)
    }

    /// Whether a value of `class` is hard-pinned: everything with `hard_pin`, records with
    /// `hard_pin_catalog` (the catalog then outlives eviction; only gc removes it).
    fn hard_pinned(&self, class: ValueClass) -> bool {
        self.hard_pin || (self.hard_pin_catalog && class == ValueClass::Record)
    }

    fn replicate_config(&self, class: ValueClass) -> sys::mooncake_replicate_config {
        sys::mooncake_replicate_config {
            replica_num: self.replica_num,
            with_soft_pin: c_int::from(self.soft_pinned(class)),
            with_hard_pin: c_int::from(self.hard_pinned(class)),
            preferred_segments: std::ptr::null(),
            preferred_segments_count: 0,
        }
    }

    /// The segment copy `copy` of a value is placed on, if segments are known.
    fn segment_for(&self, copy: u32) -> Option<&CString> {
        let segments = self.segments.get_or_init(|| match &self.segments_url {
            Some(url) => connect::read_segments(url, self.probe_timeout),
            None => Vec::new(),
        });
        (!segments.is_empty()).then(|| &segments[copy as usize % segments.len()])
    }
}

/// Reads of one key before a `LeaseExpired` is returned.
const LEASE_EXPIRED_READS: u32 = 3;

impl MooncakeStore {
    /// Fills a leased staging buffer in place and puts it from there, on the segment for copy
    /// `copy` where one is given and segments are known.
    fn put_placed(
        &self,
        key: &str,
        len: usize,
        class: ValueClass,
        copy: Option<u32>,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> StoreResult<bool> {
        let k = c_key(key)?;
        self.check_size(len)?;
        let mut lease = self.lease(Need::AtLeast(len))?;
        if !fill(&mut lease.buf_mut().bytes_mut()[..len]) {
            return Ok(false);
        }
        let mut lease = Some(lease);
        let k = &k;
        self.retrying("put", key, || {
            let mut held = lease
                .take()
                .expect("the lease comes back from every call answered");
            let k = k.clone();
            let (back, r) = self.call(move |inner| {
                let mut cfg = inner.replicate_config(class);
                let preferred = copy
                    .and_then(|c| inner.segment_for(c))
                    .map(|s| [s.as_ptr()]);
                if let Some(names) = &preferred {
                    cfg.preferred_segments = names.as_ptr();
                    cfg.preferred_segments_count = names.len();
                }
                // SAFETY: the registered buffer holds `len` bytes of the value and is held by this
                // thread's lease until the call returns; the key is NUL-terminated; the preferred
                // segment's name lives in `inner` and its pointer array on this frame, both past the
                // call.
                let rc = unsafe {
                    (inner.lib.put_from)(
                        inner.handle.0,
                        k.as_ptr(),
                        held.buf_mut().as_mut_ptr(),
                        len,
                        &cfg,
                    )
                };
                let r = put_result(inner, i64::from(rc), &k.to_string_lossy()).map(|()| true);
                (held, r)
            })?;
            lease = Some(back);
            r
        })
    }

    /// Tries again so far, of every call: each try after a failure that passes by itself.
    pub fn retries(&self) -> u64 {
        *self.retries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until at least `n` tries again have been made (a drill's signal that a call is
    /// failing and waiting); false if `within` passed first.
    pub fn wait_for_retries(&self, n: u64, within: Duration) -> bool {
        let count = self.retries.lock().unwrap_or_else(PoisonError::into_inner);
        let (count, _) = self
            .retried
            .wait_timeout_while(count, within, |count| *count < n)
            .unwrap_or_else(PoisonError::into_inner);
        *count >= n
    }

    fn count_retry(&self) {
        *self.retries.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.retried.notify_all();
    }

    /// `op` tried again within `retry_for` while it fails with a failure that passes by itself.
    fn retrying<T>(
        &self,
        op: &str,
        key: &str,
        f: impl FnMut() -> StoreResult<T>,
    ) -> StoreResult<T> {
        retry::retrying(self.retry_for, f, |e, wait| {
            self.count_retry();
            tracing::debug!("{e}; {op} {key} again in {wait:?}");
        })
    }

    /// A batched call over `n` keys, the keys that failed with a failure that passes by itself
    /// asked again together within `retry_for`.
    fn retrying_batch<T>(
        &self,
        op: &str,
        n: usize,
        batch: impl FnMut(&[usize]) -> Vec<StoreResult<T>>,
    ) -> Vec<StoreResult<T>> {
        retry::retrying_batch(n, self.retry_for, batch, |e, keys, wait| {
            self.count_retry();
            tracing::debug!("{e}; {op} of {keys} keys again in {wait:?}");
        })
    }

    /// Bytes of staging buffers that exist now (registered with the library): grows with the
    /// largest values moved and the calls in flight at once, bounded by `staging_buffers x
    /// staging_buffer_size`.
    pub fn registered_staging_bytes(&self) -> u64 {
        self.inner.pool.bytes() as u64
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

    /// One read of `get_capped`.
    fn get_capped_once(&self, key: &str, limit: u64) -> StoreResult<Option<Vec<u8>>> {
        let limit = limit.min(self.limit);
        let k = c_key(key)?;
        // The size is unknown: try the largest free buffer (or a small new one), then, if the
        // value is bigger, one that fits it.
        let mut lease = self.lease(Need::Any)?;
        let key2 = k.clone();
        let size = match self.call(move |inner| get_once(inner, &mut lease, &key2, limit))? {
            GetOnce::Done(r) => return r,
            GetOnce::Bigger(size) => size,
        };
        if size > limit {
            return Err(StoreError::TooLarge { size, limit });
        }
        let mut lease = self.lease(Need::AtLeast(size as usize))?;
        match self.call(move |inner| get_once(inner, &mut lease, &k, limit))? {
            GetOnce::Done(r) => r,
            // Removed and written again bigger in between (puts do not overwrite).
            GetOnce::Bigger(size) => Err(StoreError::Other(format!(
                "get {key}: the value changed size ({size} bytes) while it was read; retry"
            ))),
        }
    }
}

fn c_key(key: &str) -> StoreResult<CString> {
    check_key(key)?;
    CString::new(key).map_err(|_| StoreError::InvalidKey(key.to_owned()))
}

/// One `get_into` with the whole leased buffer: the value copied out, a miss, or the size of a
/// value too big for this buffer. A value over `limit` is refused before it is copied out.
fn get_once(inner: &Inner, lease: &mut Lease, key: &CString, limit: u64) -> GetOnce {
    let buf = lease.buf_mut();
    let len = buf.len();
    // SAFETY: the buffer is registered, `len` bytes, and held by this lease for the call.
    let n = unsafe { (inner.lib.get_into)(inner.handle.0, key.as_ptr(), buf.as_mut_ptr(), len) };
    if n >= 0 && n as u64 > limit {
        return GetOnce::Done(Err(StoreError::TooLarge {
            size: n as u64,
            limit,
        }));
    }
    get_result(inner, n, key, buf)
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

    /// Placed with Mooncake's `preferred_segments` on the `copy`-th known segment, so the copies
    /// of one pack sit on different store nodes and a rollout's reads spread over them.
    fn put_copy(&self, key: &str, value: &[u8], class: ValueClass, copy: u32) -> StoreResult<()> {
        self.put_placed(key, value.len(), class, Some(copy), &mut |buf| {
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
        self.put_placed(key, len, class, None, fill)
    }

    fn get(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
        self.get_capped(key, self.limit)
    }

    /// A value over `limit` is refused from the size the first read reports, before a buffer
    /// that could hold it is made; one that fits the first buffer is refused before it is copied
    /// out of that (registered) buffer, so the heap never holds it.
    fn get_capped(&self, key: &str, limit: u64) -> StoreResult<Option<Vec<u8>>> {
        self.retrying("get", key, || self.get_capped_reads(key, limit))
    }

    fn exists(&self, key: &str) -> StoreResult<bool> {
        self.retrying("exists", key, || self.exists_once(key))
    }

    fn remove(&self, key: &str) -> StoreResult<bool> {
        self.retrying("remove", key, || self.remove_once(key))
    }

    fn put_batch(&self, items: &[(&str, &[u8])], class: ValueClass) -> Vec<StoreResult<()>> {
        self.retrying_batch("put", items.len(), |at| {
            let some: Vec<_> = at.iter().map(|&i| items[i]).collect();
            self.batch_put(&some, class)
        })
    }

    fn get_batch(&self, keys: &[&str]) -> Vec<StoreResult<Option<Vec<u8>>>> {
        self.retrying_batch("get", keys.len(), |at| {
            let some: Vec<_> = at.iter().map(|&i| keys[i]).collect();
            self.batch_get(&some)
        })
    }

    fn get_sized_batch(&self, items: &[(&str, u64)]) -> Vec<StoreResult<Option<Fetched>>> {
        self.retrying_batch("get", items.len(), |at| {
            let some: Vec<_> = at.iter().map(|&i| items[i]).collect();
            self.batch_get_sized(&some)
        })
    }

    fn exists_batch(&self, keys: &[&str]) -> Vec<StoreResult<bool>> {
        self.retrying_batch("exists", keys.len(), |at| {
            let some: Vec<_> = at.iter().map(|&i| keys[i]).collect();
            self.batch_exists(&some)
        })
    }
}

impl MooncakeStore {
    /// `get_capped` without the retry of failures that pass: a read that outlived its lease is
    /// read again at once, a few times.
    fn get_capped_reads(&self, key: &str, limit: u64) -> StoreResult<Option<Vec<u8>>> {
        // A read slower than its lease (an overloaded node, or this host starved of CPU: a
        // rollout's herd) fails; a new read takes a new lease.
        for _ in 1..LEASE_EXPIRED_READS {
            match self.get_capped_once(key, limit) {
                Err(StoreError::LeaseExpired(why)) => tracing::debug!("{why}; reading again"),
                done => return done,
            }
        }
        self.get_capped_once(key, limit)
    }

    fn exists_once(&self, key: &str) -> StoreResult<bool> {
        let k = c_key(key)?;
        self.call(move |inner| {
            // SAFETY: the key is NUL-terminated.
            let rc = unsafe { (inner.lib.is_exist)(inner.handle.0, k.as_ptr()) };
            exists_result(inner, i64::from(rc), &k.to_string_lossy())
        })?
    }

    fn remove_once(&self, key: &str) -> StoreResult<bool> {
        let k = c_key(key)?;
        self.call(move |inner| {
            // SAFETY: the key is NUL-terminated; force=0 respects readers' leases.
            let rc = unsafe { (inner.lib.remove)(inner.handle.0, k.as_ptr(), 0) };
            remove_result(inner, i64::from(rc), &k.to_string_lossy())
        })?
    }
}
