//! The staging buffers: page-aligned memory registered with the client, made on demand and
//! leased to one call at a time. The library reads and writes a buffer only inside a call, through
//! a pointer taken from `&mut Staging`, so the buffer's single holder (the pool or one lease) is
//! the only one that can hand it to the library.

use std::ffi::c_void;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{Inner, MooncakeStore};
use crate::{StoreError, StoreResult};

/// Staging buffers are page aligned (RDMA registration works on pages).
pub(super) const BUFFER_ALIGN: usize = 4096;
/// The smallest staging buffer made: heads, records and manifests of up to about 40,000 files
/// share it. Registering costs one metadata round trip whatever the size and the mapping is lazy
/// (pages cost memory once a value fills them), so a size that fits a big manifest saves an
/// install its second registration, and the failed first get, for no memory.
const MIN_STAGING: usize = 8 << 20;

/// One page-aligned staging buffer, registered with the client while it exists.
///
/// An anonymous mapping (`memmap2`) rather than `std::alloc::alloc_zeroed`: for an alignment above
/// the allocator's minimum, `alloc_zeroed` writes zeros over the whole buffer, which made every
/// byte of every staging buffer resident at start (4 x 64 MiB for any command). Anonymous pages
/// are zero and cost nothing until touched, so only the bytes a call moves become resident (RDMA
/// registration still pins the whole buffer, which is why buffers are also sized to the work).
///
/// No `unsafe impl Send/Sync`: the mapping is both, and the only pointer the library gets comes
/// from [`Staging::as_mut_ptr`], which needs exclusive access.
pub(super) struct Staging {
    map: memmap2::MmapMut,
}

impl Staging {
    fn map(len: usize) -> StoreResult<Self> {
        let map = memmap2::MmapMut::map_anon(len).map_err(|e| {
            StoreError::Other(format!("cannot map a staging buffer of {len} bytes: {e}"))
        })?;
        Ok(Self { map })
    }

    /// The address the library reads from or writes into during one call. `&mut`: whoever hands
    /// it to the library holds the buffer alone for that call.
    pub(super) fn as_mut_ptr(&mut self) -> *mut c_void {
        self.map.as_mut_ptr().cast()
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// The first `n` bytes, `n <= len`.
    pub(super) fn bytes(&self, n: usize) -> &[u8] {
        &self.map[..n.min(self.map.len())]
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map[..]
    }
}

/// What a call needs from the pool.
#[derive(Clone, Copy, Debug)]
pub(super) enum Need {
    /// A buffer of at least this many bytes (at most the configured buffer size).
    AtLeast(usize),
    /// Any buffer, the larger the better (a get of a value of unknown size).
    Any,
}

impl Need {
    fn fits(self, b: &Staging) -> bool {
        match self {
            Need::AtLeast(n) => b.len() >= n,
            Need::Any => true,
        }
    }
}

/// The staging buffers: made on demand, at most `max_buffers`, each at most `max_size` bytes.
pub(super) struct Pool {
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
    pub(super) fn new(max_buffers: usize, max_size: usize) -> Self {
        Self {
            state: Mutex::new(PoolState {
                free: Vec::new(),
                count: 0,
                bytes: 0,
            }),
            returned: Condvar::new(),
            max_buffers,
            max_size,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes of the buffers that exist now.
    pub(super) fn bytes(&self) -> usize {
        self.state().bytes
    }

    /// Every free buffer, for the teardown (by then no lease is left).
    pub(super) fn take_free(&self) -> Vec<Staging> {
        std::mem::take(&mut self.state().free)
    }

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

/// What `lease` does when no free buffer fits.
enum Make {
    /// Make a new buffer (counted already).
    New,
    /// Make one in place of this free one, which is too small.
    Replace(Staging),
}

impl Inner {
    /// Takes a staging buffer for `need`, making or growing one when none that fits is free,
    /// waiting at most `timeout` for one to come back when `max_buffers` are leased.
    pub(super) fn lease(self: &Arc<Self>, need: Need, timeout: Duration) -> StoreResult<Lease> {
        let deadline = Instant::now() + timeout;
        let pool = &self.pool;
        let mut state = pool.state();
        loop {
            // A free buffer that fits: the smallest such for a known size, the largest for a get.
            let free = state.free.iter().enumerate();
            let pick = match need {
                Need::AtLeast(_) => free
                    .filter(|(_, b)| need.fits(b))
                    .min_by_key(|(_, b)| b.len()),
                Need::Any => free.max_by_key(|(_, b)| b.len()),
            }
            .map(|(i, _)| i);
            if let Some(i) = pick {
                let buf = state.free.swap_remove(i);
                return Ok(self.leased(buf));
            }
            // None fits: make one if under the bound, else replace a free one that is too small.
            let make = if state.count < pool.max_buffers {
                state.count += 1;
                Some(Make::New)
            } else if !state.free.is_empty() {
                let i = (0..state.free.len())
                    .max_by_key(|&i| state.free[i].len())
                    .unwrap_or(0);
                Some(Make::Replace(state.free.swap_remove(i)))
            } else {
                None
            };
            if let Some(make) = make {
                let size = pool.size_for(need);
                if let Make::Replace(old) = &make {
                    state.bytes -= old.len();
                }
                state.bytes += size;
                drop(state);
                return self.make(make, size);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(StoreError::Timeout(timeout));
            }
            state = pool
                .returned
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Makes a buffer of `size` bytes that `lease` counted already, giving the count back when
    /// registering fails.
    fn make(self: &Arc<Self>, make: Make, size: usize) -> StoreResult<Lease> {
        if let Make::Replace(mut old) = make {
            self.unregister(&mut old);
        }
        match self.register(size) {
            Ok(buf) => Ok(self.leased(buf)),
            Err(e) => {
                let mut state = self.pool.state();
                state.count -= 1;
                state.bytes -= size;
                self.pool.returned.notify_one();
                Err(e)
            }
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
        let mut buf = Staging::map(size)?;
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

    /// Unregisters a buffer taken out of the pool (so no call uses it).
    pub(super) fn unregister(&self, buf: &mut Staging) {
        // SAFETY: the buffer was registered with this live handle and no call uses it (it is
        // held here alone).
        unsafe { (self.lib.unregister_buffer)(self.handle.0, buf.as_mut_ptr()) };
    }
}

impl MooncakeStore {
    /// Takes a staging buffer for `need`, waiting at most `call_timeout` for one.
    pub(super) fn lease(&self, need: Need) -> StoreResult<Lease> {
        self.inner.lease(need, self.call_timeout)
    }
}

/// A staging buffer taken from the pool; goes back when dropped (on whichever thread).
pub(super) struct Lease {
    inner: Arc<Inner>,
    buf: Option<Staging>,
}

impl Lease {
    pub(super) fn buf(&self) -> &Staging {
        self.buf
            .as_ref()
            .expect("a lease holds its buffer until dropped")
    }

    pub(super) fn buf_mut(&mut self) -> &mut Staging {
        self.buf
            .as_mut()
            .expect("a lease holds its buffer until dropped")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.inner.pool.state().free.push(buf);
            self.inner.pool.returned.notify_one();
        }
    }
}

/// One value of a `get_sized_batch`, read in place from the staging buffer it was fetched into;
/// the buffer goes back to the pool when the last value of its batch is dropped. Shared leases
/// only read: no call can get the buffer's pointer through an `Arc<Lease>`.
pub(super) struct LeasedValue {
    pub(super) lease: Arc<Lease>,
    pub(super) at: usize,
    pub(super) len: usize,
}

impl AsRef<[u8]> for LeasedValue {
    fn as_ref(&self) -> &[u8] {
        &self.lease.buf().bytes(self.at + self.len)[self.at..]
    }
}
