//! What the library's return codes mean: RPC_FAIL (-900), RPC_TIMEOUT (-901) and
//! UNAVAILABLE_IN_CURRENT_STATUS (-1010, an HA master not serving yet) `MasterDown`;
//! TRANSFER_FAIL (-800) and CHECKSUM_MISMATCH (-801, a transfer that arrived damaged) `NodeDown`;
//! OBJECT_REPLICA_BUSY (-714) `Unavailable`; NO_AVAILABLE_HANDLE (-200) `NoSpace`;
//! OBJECT_HAS_LEASE (-706) `Leased`; LEASE_EXPIRED (-707) `LeaseExpired` (a read slower than its
//! lease: read again); OBJECT_NOT_FOUND (-704), REPLICA_IS_NOT_READY (-703) and REPLICA_IS_GONE
//! (-712, the replica's node died or it was evicted since the master pointed at it) a miss on
//! reads; and per call what counts as success. All of these but NoSpace and Leased are transient
//! (`StoreError::is_transient`): a tiered store reads the durable tier instead. Every other code
//! is `Other`, with its name (`mooncake_sys::code_name`).

use std::ffi::CString;

use mooncake_sys as sys;

use super::Inner;
use super::pool::Staging;
use crate::{StoreError, StoreResult};

impl Inner {
    /// What a negative code means, for an operation on `key`.
    pub(super) fn error(&self, code: i64, op: &str, key: &str) -> StoreError {
        let name = sys::code_name(code);
        match code {
            sys::RPC_FAIL | sys::RPC_TIMEOUT | sys::UNAVAILABLE_IN_CURRENT_STATUS => {
                StoreError::MasterDown(format!(
                    "{op} {key}: the master {} did not answer ({name} {code}); is mooncake_master running and reachable?",
                    self.master
                ))
            }
            sys::TRANSFER_FAIL | sys::CHECKSUM_MISMATCH => StoreError::NodeDown(format!(
                "{op} {key}: the store node holding the object did not answer ({name} {code}); are the mooncake_client store nodes up?"
            )),
            sys::OBJECT_REPLICA_BUSY => StoreError::Unavailable(format!(
                "{op} {key}: the object's replicas are busy ({name} {code}); try again"
            )),
            sys::NO_AVAILABLE_HANDLE => StoreError::NoSpace(format!(
                "{op} {key}: no store node registered with the master {} has room ({name} {code}); right after a master restart the store nodes have not registered again yet (seconds): retry; if it lasts, add store nodes or segment space, or unpin objects",
                self.master
            )),
            sys::OBJECT_HAS_LEASE => StoreError::Leased(key.to_owned()),
            sys::LEASE_EXPIRED => StoreError::LeaseExpired(format!(
                "{op} {key}: the read took longer than the lease the master gave it ({name} {code}); the store node or this host is overloaded"
            )),
            sys::INVALID_KEY => StoreError::InvalidKey(key.to_owned()),
            _ => StoreError::Other(format!("{op} {key}: Mooncake returned {code} ({name})")),
        }
    }
}

/// A put's code. An existing key keeps its old value (OBJECT_ALREADY_EXISTS): that is the
/// immutable put of the contract.
pub(super) fn put_result(inner: &Inner, code: i64, key: &str) -> StoreResult<()> {
    match code {
        c if c >= 0 || c == sys::OBJECT_ALREADY_EXISTS => Ok(()),
        c => Err(inner.error(c, "put", key)),
    }
}

/// An `is_exist` code.
pub(super) fn exists_result(inner: &Inner, code: i64, key: &str) -> StoreResult<bool> {
    match code {
        1 => Ok(true),
        0 | sys::OBJECT_NOT_FOUND => Ok(false),
        c => Err(inner.error(c, "exists", key)),
    }
}

/// A `remove` code.
pub(super) fn remove_result(inner: &Inner, code: i64, key: &str) -> StoreResult<bool> {
    match code {
        c if c >= 0 => Ok(true),
        sys::OBJECT_NOT_FOUND => Ok(false),
        c => Err(inner.error(c, "remove", key)),
    }
}

/// What one `get_into` with a leased buffer found.
pub(super) enum GetOnce {
    Done(StoreResult<Option<Vec<u8>>>),
    /// The value is this many bytes, more than the buffer tried.
    Bigger(u64),
}

/// A get's code `n` for `key` read into `buf`: the value copied out, a miss, an error, or (asking
/// the library for the size when the buffer was too small) the size to read it with.
pub(super) fn get_result(inner: &Inner, n: i64, key: &CString, buf: &Staging) -> GetOnce {
    let k = key.to_string_lossy();
    match n {
        n if n >= 0 => GetOnce::Done(Ok(Some(buf.bytes(n as usize).to_vec()))),
        // Not stored, evicted, removed, still being written by someone, or its replica gone with
        // its node: a miss.
        sys::OBJECT_NOT_FOUND | sys::REPLICA_IS_NOT_READY | sys::REPLICA_IS_GONE => {
            GetOnce::Done(Ok(None))
        }
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
