//! Batched calls: keys are checked, grouped so a group's values fit one staging buffer (or one
//! call), each group is one library call, and its per-key answers are scattered back into one
//! result per key (`Results`). A key a group could not answer is read alone at the end.

use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::Arc;

use mooncake_sys as sys;

use super::codes::{exists_result, put_result};
use super::pool::{BUFFER_ALIGN, Lease, LeasedValue, Need, Staging};
use super::{Inner, MooncakeStore, c_key};
use crate::{Fetched, Store, StoreError, StoreResult, ValueClass};

/// Most keys one `batch_get_into` asks for (each gets an equal slot of one staging buffer).
const GET_BATCH: usize = 64;
/// Most keys one `batch_is_exist` asks for.
const EXISTS_BATCH: usize = 1024;
/// Values of one `batch_put_from` start at multiples of this in the buffer.
const PUT_ALIGN: usize = 64;

/// What one group's call answered: per key a result, or `None` to read that key alone; or the
/// failure of the whole group.
type Answers<T> = StoreResult<Vec<Option<StoreResult<T>>>>;

/// One result per key of a batched call, filled group by group; `None` until answered.
struct Results<T>(Vec<Option<StoreResult<T>>>);

impl<T> Results<T> {
    /// Sorts checked keys: an error is the key's result, `Ok(None)` leaves it to be read alone,
    /// `Ok(Some(v))` is returned with the key's index for a group.
    fn sort<V>(
        checked: impl ExactSizeIterator<Item = StoreResult<Option<V>>>,
    ) -> (Self, Vec<(usize, V)>) {
        let mut results = Vec::with_capacity(checked.len());
        let mut valid = Vec::with_capacity(checked.len());
        for (i, c) in checked.enumerate() {
            results.push(match c {
                Ok(Some(v)) => {
                    valid.push((i, v));
                    None
                }
                Ok(None) => None,
                Err(e) => Some(Err(e)),
            });
        }
        (Self(results), valid)
    }

    /// Writes one group's outcome: each key's answer at its index, or the group's failure at
    /// every index.
    fn scatter(&mut self, at: impl IntoIterator<Item = usize>, outcome: Answers<T>) {
        match outcome {
            Ok(answers) => {
                for (i, r) in at.into_iter().zip(answers) {
                    self.0[i] = r;
                }
            }
            Err(e) => {
                for i in at {
                    self.0[i] = Some(Err(e.clone()));
                }
            }
        }
    }

    /// The results, each key no group answered read alone by `single`.
    fn finish(self, mut single: impl FnMut(usize) -> StoreResult<T>) -> Vec<StoreResult<T>> {
        self.0
            .into_iter()
            .enumerate()
            .map(|(i, r)| r.unwrap_or_else(|| single(i)))
            .collect()
    }
}

/// Packs values of `sizes` one after another at multiples of `align`, as many as fit in `cap`
/// bytes (at least one): their offsets and the bytes they span.
fn pack(sizes: impl Iterator<Item = usize>, align: usize, cap: usize) -> (Vec<usize>, usize) {
    let (mut offsets, mut used) = (Vec::new(), 0usize);
    for size in sizes {
        let at = used.next_multiple_of(align);
        if !offsets.is_empty() && at + size > cap {
            break;
        }
        offsets.push(at);
        used = at + size;
    }
    (offsets, used)
}

impl MooncakeStore {
    pub(super) fn batch_put(
        &self,
        items: &[(&str, &[u8])],
        class: ValueClass,
    ) -> Vec<StoreResult<()>> {
        let (mut results, valid) = Results::sort(items.iter().map(|(key, value)| {
            let k = c_key(key)?;
            self.check_size(value.len())?;
            Ok(Some((k, *value)))
        }));
        let mut rest = &valid[..];
        while !rest.is_empty() {
            let sizes = rest.iter().map(|(_, (_, v))| v.len());
            let (offsets, used) = pack(sizes, PUT_ALIGN, self.limit as usize);
            let (group, next) = rest.split_at(offsets.len());
            match self.lease(Need::AtLeast(used)) {
                Ok(lease) => {
                    let outcome = self.put_group(lease, group, &offsets, class);
                    results.scatter(group.iter().map(|(i, _)| *i), outcome);
                }
                Err(e) => {
                    // Nothing left would get a buffer sooner.
                    results.scatter(rest.iter().map(|(i, _)| *i), Err(e));
                    break;
                }
            }
            rest = next;
        }
        results.finish(|i| self.put(items[i].0, items[i].1, class))
    }

    /// Copies `group` into the leased buffer at `offsets` and puts it with one `batch_put_from`.
    fn put_group(
        &self,
        mut lease: Lease,
        group: &[(usize, (CString, &[u8]))],
        offsets: &[usize],
        class: ValueClass,
    ) -> Answers<()> {
        let buf = lease.buf_mut().bytes_mut();
        for (&at, (_, (_, v))) in offsets.iter().zip(group) {
            buf[at..at + v.len()].copy_from_slice(v);
        }
        let keys: Vec<CString> = group.iter().map(|(_, (k, _))| k.clone()).collect();
        let sizes: Vec<usize> = group.iter().map(|(_, (_, v))| v.len()).collect();
        let offsets = offsets.to_vec();
        self.call(move |inner| {
            let (rc, out) = batch_put_from(inner, &mut lease, &keys, &offsets, &sizes, class);
            drop(lease);
            keys.iter()
                .enumerate()
                .map(|(i, k)| {
                    Some(put_result(
                        inner,
                        key_code(rc, &out, i),
                        &k.to_string_lossy(),
                    ))
                })
                .collect()
        })
    }

    pub(super) fn batch_get(&self, keys: &[&str]) -> Vec<StoreResult<Option<Vec<u8>>>> {
        let (mut results, valid) = Results::sort(keys.iter().map(|key| c_key(key).map(Some)));
        for group in valid.chunks(GET_BATCH) {
            let at = group.iter().map(|(i, _)| *i);
            let outcome = self.lease(Need::Any).and_then(|lease| {
                self.get_group(lease, group.iter().map(|(_, k)| k.clone()).collect())
            });
            results.scatter(at, outcome);
        }
        let mut out = results.finish(|i| self.get(keys[i]));
        // A key whose read outlived its lease is read again alone (`get` retries it).
        for (i, r) in out.iter_mut().enumerate() {
            if matches!(r, Err(StoreError::LeaseExpired(_))) {
                *r = self.get(keys[i]);
            }
        }
        out
    }

    /// Reads `keys` with one `batch_get_into`, each into an equal, page-aligned slot of the
    /// leased buffer, copying the values out; a value too big for its slot is left unanswered
    /// (read alone once this lease is back).
    fn get_group(&self, mut lease: Lease, keys: Vec<CString>) -> Answers<Option<Vec<u8>>> {
        self.call(move |inner| {
            let len = lease.buf().len();
            let slot = (len / keys.len()) / BUFFER_ALIGN * BUFFER_ALIGN;
            let slot = slot.max(BUFFER_ALIGN.min(len));
            let n = keys.len().min(len / slot);
            // n * slot <= len, so every slot lies inside the leased buffer.
            let offsets: Vec<usize> = (0..n).map(|i| i * slot).collect();
            let (rc, out) = batch_get_into(inner, &mut lease, &keys[..n], &offsets, &vec![slot; n]);
            let buf = lease.buf();
            keys.iter()
                .enumerate()
                .map(|(i, k)| {
                    if i >= n {
                        return None; // no slot left for it: read alone
                    }
                    let r = batch_get_result(inner, rc, &out, i, k)?;
                    Some(r.map(|len| len.map(|len| buf.bytes(i * slot + len)[i * slot..].to_vec())))
                })
                .collect()
        })
    }

    /// Packs consecutive values at page-aligned offsets into one staging buffer per
    /// `batch_get_into` and hands them out in place (no copy into vectors). A value whose size is
    /// other than expected, or not storable here, is read alone by `get`.
    pub(super) fn batch_get_sized(
        &self,
        items: &[(&str, u64)],
    ) -> Vec<StoreResult<Option<Fetched>>> {
        let (mut results, valid) = Results::sort(items.iter().map(|&(key, size)| {
            let k = c_key(key)?;
            Ok((size > 0 && size <= self.limit).then_some((k, size as usize)))
        }));
        let mut rest = &valid[..];
        while !rest.is_empty() {
            let sizes = rest.iter().map(|(_, (_, n))| *n);
            let (offsets, used) = pack(sizes, BUFFER_ALIGN, self.limit as usize);
            let (group, next) = rest.split_at(offsets.len());
            rest = next;
            let outcome = self
                .lease(Need::AtLeast(used))
                .and_then(|lease| self.get_sized_group(lease, group, offsets));
            results.scatter(group.iter().map(|(i, _)| *i), outcome);
        }
        let mut out = results.finish(|i| Ok(self.get(items[i].0)?.map(Fetched::from)));
        for (i, r) in out.iter_mut().enumerate() {
            if matches!(r, Err(StoreError::LeaseExpired(_))) {
                *r = self.get(items[i].0).map(|v| v.map(Fetched::from));
            }
        }
        out
    }

    /// Reads `group` with one `batch_get_into`, key j at `offsets[j]` of the leased buffer, and
    /// answers with slices of that buffer, which goes back to the pool once all are dropped.
    fn get_sized_group(
        &self,
        lease: Lease,
        group: &[(usize, (CString, usize))],
        offsets: Vec<usize>,
    ) -> Answers<Option<Fetched>> {
        let keys: Vec<CString> = group.iter().map(|(_, (k, _))| k.clone()).collect();
        let sizes: Vec<usize> = group.iter().map(|(_, (_, n))| *n).collect();
        let at = offsets.clone();
        let (lease, rc, out) = self.call(move |inner| {
            let mut lease = lease;
            // offsets[j] + sizes[j] <= used <= the leased buffer's length (packed so).
            let (rc, out) = batch_get_into(inner, &mut lease, &keys, &at, &sizes);
            (lease, rc, out)
        })?;
        let lease = Arc::new(lease);
        let answers = group.iter().enumerate().map(|(j, (_, (k, _)))| {
            let r = batch_get_result(&self.inner, rc, &out, j, k)?;
            Some(r.map(|len| {
                len.map(|len| {
                    Fetched::new(LeasedValue {
                        lease: lease.clone(),
                        at: offsets[j],
                        len,
                    })
                })
            }))
        });
        Ok(answers.collect())
    }

    pub(super) fn batch_exists(&self, keys: &[&str]) -> Vec<StoreResult<bool>> {
        let (mut results, valid) = Results::sort(keys.iter().map(|key| c_key(key).map(Some)));
        for group in valid.chunks(EXISTS_BATCH) {
            let keys: Vec<CString> = group.iter().map(|(_, k)| k.clone()).collect();
            let outcome = self.call(move |inner| {
                let ptrs = key_ptrs(&keys);
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
                    .enumerate()
                    .map(|(i, k)| {
                        Some(exists_result(
                            inner,
                            key_code(rc, &out, i),
                            &k.to_string_lossy(),
                        ))
                    })
                    .collect()
            });
            results.scatter(group.iter().map(|(i, _)| *i), outcome);
        }
        results.finish(|i| self.exists(keys[i]))
    }
}

/// Key `i`'s code of a batched call that returned `rc` and per-key codes `out`: the call's own
/// code when it failed as a whole.
fn key_code<C: Copy + Into<i64>>(rc: c_int, out: &[C], i: usize) -> i64 {
    if rc < 0 { i64::from(rc) } else { out[i].into() }
}

/// What key `i` of a `batch_get_into` found: the bytes read, a miss, an error, or `None` to read
/// it alone (too big for its slot, or the whole call refused for a reason other than the master).
fn batch_get_result(
    inner: &Inner,
    rc: c_int,
    out: &[i64],
    i: usize,
    key: &CString,
) -> Option<StoreResult<Option<usize>>> {
    match key_code(rc, out, i) {
        n if n >= 0 => Some(Ok(Some(n as usize))),
        sys::INVALID_PARAMS | sys::BUFFER_OVERFLOW => None,
        c if rc < 0 && c != sys::RPC_FAIL => None,
        // Not stored, evicted, removed, still being written by someone, or its replica gone with
        // its node: a miss.
        sys::OBJECT_NOT_FOUND | sys::REPLICA_IS_NOT_READY | sys::REPLICA_IS_GONE => Some(Ok(None)),
        c => Some(Err(inner.error(c, "get", &key.to_string_lossy()))),
    }
}

fn key_ptrs(keys: &[CString]) -> Vec<*const c_char> {
    keys.iter().map(|k| k.as_ptr()).collect()
}

/// Pointers to the slots of the buffer at `offsets`, each `sizes[i]` bytes.
///
/// Panics unless every slot lies inside the buffer (the callers pack them so).
fn slots(buf: &mut Staging, offsets: &[usize], sizes: &[usize]) -> Vec<*mut c_void> {
    assert!(offsets.len() == sizes.len());
    assert!(offsets.iter().zip(sizes).all(|(o, n)| o + n <= buf.len()));
    let base = buf.as_mut_ptr().cast::<u8>();
    // SAFETY: every offset lies inside the buffer (asserted above).
    offsets
        .iter()
        .map(|&o| unsafe { base.add(o) }.cast())
        .collect()
}

/// One `batch_put_from` of `keys` from the leased buffer, key i at `offsets[i]`, `sizes[i]`
/// bytes: the call's code and each key's code.
fn batch_put_from(
    inner: &Inner,
    lease: &mut Lease,
    keys: &[CString],
    offsets: &[usize],
    sizes: &[usize],
    class: ValueClass,
) -> (c_int, Vec<c_int>) {
    assert!(keys.len() == offsets.len());
    let mut bufs = slots(lease.buf_mut(), offsets, sizes);
    let key_ptrs = key_ptrs(keys);
    let mut out: Vec<c_int> = vec![0; keys.len()];
    let cfg = inner.replicate_config(class);
    // SAFETY: all arrays have `keys.len()` entries; the registered buffer is held by the lease
    // for the call and every slot fits in it; keys are NUL-terminated.
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
    (rc, out)
}

/// One `batch_get_into` of `keys` into the leased buffer, key i at `offsets[i]` with room for
/// `sizes[i]` bytes: the call's code and each key's result (bytes read or a negative code).
fn batch_get_into(
    inner: &Inner,
    lease: &mut Lease,
    keys: &[CString],
    offsets: &[usize],
    sizes: &[usize],
) -> (c_int, Vec<i64>) {
    assert!(keys.len() == offsets.len());
    let mut bufs = slots(lease.buf_mut(), offsets, sizes);
    let key_ptrs = key_ptrs(keys);
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
