//! Raw bindings to Mooncake Store's C ABI, `store_c.h` (written from the header shipped in the
//! `tokenspeed-mooncake==0.3.13.post20261027` wheel as `mooncake/include/store_c.h`).
//!
//! Nothing is linked at build time: [`MooncakeLib::load`] opens `libmooncake_store.so` from a path
//! chosen by the operator, with `libloading`, and resolves every function up front. So this crate
//! (and jitship) builds and runs on machines with no Mooncake at all, and a missing library or a
//! library without one of the functions is a [`LoadError`] naming the path and the symbol.
//!
//! Everything here is as unsafe as the C ABI: pointers and lengths must be valid for each call.
//! The safe wrapper lives in jitship's `store::mooncake`.

#![allow(non_camel_case_types)]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// `typedef void *mooncake_store_t;`: an opaque client handle.
pub type mooncake_store_t = *mut c_void;

/// `struct mooncake_replicate_config`, passed to the put calls (NULL means 1 replica, no pins).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mooncake_replicate_config {
    pub replica_num: usize,
    pub with_soft_pin: c_int,
    pub with_hard_pin: c_int,
    /// Segment names the replicas should preferably go to; may be NULL when the count is 0.
    pub preferred_segments: *const *const c_char,
    pub preferred_segments_count: usize,
}

// Return codes of Mooncake's `ErrorCode` seen through the C ABI (negative ints).
pub const INTERNAL_ERROR: i64 = -1;
pub const BUFFER_OVERFLOW: i64 = -10;
pub const NO_AVAILABLE_HANDLE: i64 = -200;
pub const INVALID_KEY: i64 = -400;
pub const WRITE_FAIL: i64 = -500;
pub const INVALID_PARAMS: i64 = -600;
pub const INVALID_WRITE: i64 = -700;
pub const INVALID_READ: i64 = -701;
pub const INVALID_REPLICA: i64 = -702;
pub const REPLICA_IS_NOT_READY: i64 = -703;
pub const OBJECT_NOT_FOUND: i64 = -704;
pub const OBJECT_ALREADY_EXISTS: i64 = -705;
pub const OBJECT_HAS_LEASE: i64 = -706;
/// A read took longer than the lease the master gave it (an overloaded node or client).
pub const LEASE_EXPIRED: i64 = -707;
pub const TRANSFER_FAIL: i64 = -800;
pub const RPC_FAIL: i64 = -900;

pub type CreateFn = unsafe extern "C" fn() -> mooncake_store_t;
pub type DestroyFn = unsafe extern "C" fn(mooncake_store_t);
pub type SetupFn = unsafe extern "C" fn(
    store: mooncake_store_t,
    local_hostname: *const c_char,
    metadata_server: *const c_char,
    global_segment_size: u64,
    local_buffer_size: u64,
    protocol: *const c_char,
    device_name: *const c_char,
    master_server_addr: *const c_char,
) -> c_int;
pub type HealthCheckFn = unsafe extern "C" fn(mooncake_store_t) -> c_int;
pub type PutFn = unsafe extern "C" fn(
    store: mooncake_store_t,
    key: *const c_char,
    value: *const c_void,
    size: usize,
    config: *const mooncake_replicate_config,
) -> c_int;
pub type PutFromFn = unsafe extern "C" fn(
    store: mooncake_store_t,
    key: *const c_char,
    buffer: *mut c_void,
    size: usize,
    config: *const mooncake_replicate_config,
) -> c_int;
pub type BatchPutFromFn = unsafe extern "C" fn(
    store: mooncake_store_t,
    keys: *const *const c_char,
    buffers: *mut *mut c_void,
    sizes: *const usize,
    count: usize,
    config: *const mooncake_replicate_config,
    results_out: *mut c_int,
) -> c_int;
pub type GetIntoFn = unsafe extern "C" fn(
    store: mooncake_store_t,
    key: *const c_char,
    buffer: *mut c_void,
    size: usize,
) -> i64;
pub type BatchGetIntoFn = unsafe extern "C" fn(
    store: mooncake_store_t,
    keys: *const *const c_char,
    buffers: *mut *mut c_void,
    sizes: *const usize,
    count: usize,
    results_out: *mut i64,
) -> c_int;
pub type IsExistFn = unsafe extern "C" fn(store: mooncake_store_t, key: *const c_char) -> c_int;
pub type BatchIsExistFn = unsafe extern "C" fn(
    store: mooncake_store_t,
    keys: *const *const c_char,
    count: usize,
    results_out: *mut c_int,
) -> c_int;
pub type GetSizeFn = unsafe extern "C" fn(store: mooncake_store_t, key: *const c_char) -> i64;
pub type RemoveFn =
    unsafe extern "C" fn(store: mooncake_store_t, key: *const c_char, force: c_int) -> c_int;
pub type RemoveByRegexFn =
    unsafe extern "C" fn(store: mooncake_store_t, pattern: *const c_char, force: c_int) -> i64;
pub type RemoveAllFn = unsafe extern "C" fn(store: mooncake_store_t, force: c_int) -> i64;
pub type RegisterBufferFn =
    unsafe extern "C" fn(store: mooncake_store_t, buffer: *mut c_void, size: usize) -> c_int;
pub type UnregisterBufferFn =
    unsafe extern "C" fn(store: mooncake_store_t, buffer: *mut c_void) -> c_int;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "cannot load the Mooncake Store library {path}: {message} (set store.mooncake.library or MOONCAKE_STORE_LIBRARY \
         to a libmooncake_store.so built with -DWITH_STORE_C_SHARED=ON; its own dependencies must be found too)"
    )]
    Library { path: PathBuf, message: String },
    #[error(
        "the Mooncake Store library {path} has no symbol {symbol}: {message} (is it a build with the C ABI, store_c.h?)"
    )]
    Symbol {
        path: PathBuf,
        symbol: &'static str,
        message: String,
    },
}

/// The functions of one loaded `libmooncake_store.so`. The library is never unloaded (see
/// [`MooncakeLib::load`]), so the function pointers stay valid for the life of the process.
#[derive(Debug)]
pub struct MooncakeLib {
    pub path: PathBuf,
    pub create: CreateFn,
    pub destroy: DestroyFn,
    pub setup: SetupFn,
    pub health_check: HealthCheckFn,
    pub put: PutFn,
    pub put_from: PutFromFn,
    pub batch_put_from: BatchPutFromFn,
    pub get_into: GetIntoFn,
    pub batch_get_into: BatchGetIntoFn,
    pub is_exist: IsExistFn,
    pub batch_is_exist: BatchIsExistFn,
    pub get_size: GetSizeFn,
    pub remove: RemoveFn,
    pub remove_by_regex: RemoveByRegexFn,
    pub remove_all: RemoveAllFn,
    pub register_buffer: RegisterBufferFn,
    pub unregister_buffer: UnregisterBufferFn,
}

static LOADED: OnceLock<Mutex<HashMap<PathBuf, Arc<MooncakeLib>>>> = OnceLock::new();

impl MooncakeLib {
    /// Loads the library at `path` (once per process and path; later calls return the same one).
    ///
    /// # Safety
    /// Loading a shared library runs its initializers, which is only sound if `path` really is a
    /// `libmooncake_store.so` whose functions have the signatures declared here (those of
    /// `store_c.h`). The library is deliberately never unloaded: Mooncake starts background
    /// threads that could still run its code after a `dlclose`.
    pub unsafe fn load(path: &Path) -> Result<Arc<MooncakeLib>, LoadError> {
        let loaded = LOADED.get_or_init(Default::default);
        let mut loaded = loaded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lib) = loaded.get(path) {
            return Ok(lib.clone());
        }
        // SAFETY: the caller vouches that `path` is a Mooncake Store library (see above).
        let library =
            unsafe { libloading::Library::new(path) }.map_err(|e| LoadError::Library {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the symbol is declared in store_c.h with exactly the signature of the
                // field it is stored in, and the library outlives the pointer (it is never unloaded).
                let s = unsafe { library.get(concat!($name, "\0").as_bytes()) }.map_err(|e| LoadError::Symbol {
                    path: path.to_owned(),
                    symbol: $name,
                    message: e.to_string(),
                })?;
                *s
            }};
        }
        let lib = MooncakeLib {
            path: path.to_owned(),
            create: sym!("mooncake_store_create"),
            destroy: sym!("mooncake_store_destroy"),
            setup: sym!("mooncake_store_setup"),
            health_check: sym!("mooncake_store_health_check"),
            put: sym!("mooncake_store_put"),
            put_from: sym!("mooncake_store_put_from"),
            batch_put_from: sym!("mooncake_store_batch_put_from"),
            get_into: sym!("mooncake_store_get_into"),
            batch_get_into: sym!("mooncake_store_batch_get_into"),
            is_exist: sym!("mooncake_store_is_exist"),
            batch_is_exist: sym!("mooncake_store_batch_is_exist"),
            get_size: sym!("mooncake_store_get_size"),
            remove: sym!("mooncake_store_remove"),
            remove_by_regex: sym!("mooncake_store_remove_by_regex"),
            remove_all: sym!("mooncake_store_remove_all"),
            register_buffer: sym!("mooncake_store_register_buffer"),
            unregister_buffer: sym!("mooncake_store_unregister_buffer"),
        };
        // Never unloaded: see the safety note above.
        std::mem::forget(library);
        let lib = Arc::new(lib);
        loaded.insert(path.to_owned(), lib.clone());
        Ok(lib)
    }
}

/// A short name for a Mooncake return code, for error messages.
pub fn code_name(code: i64) -> &'static str {
    match code {
        INTERNAL_ERROR => "INTERNAL_ERROR",
        BUFFER_OVERFLOW => "BUFFER_OVERFLOW",
        NO_AVAILABLE_HANDLE => "NO_AVAILABLE_HANDLE",
        INVALID_KEY => "INVALID_KEY",
        WRITE_FAIL => "WRITE_FAIL",
        INVALID_PARAMS => "INVALID_PARAMS",
        INVALID_WRITE => "INVALID_WRITE",
        INVALID_READ => "INVALID_READ",
        INVALID_REPLICA => "INVALID_REPLICA",
        REPLICA_IS_NOT_READY => "REPLICA_IS_NOT_READY",
        OBJECT_NOT_FOUND => "OBJECT_NOT_FOUND",
        OBJECT_ALREADY_EXISTS => "OBJECT_ALREADY_EXISTS",
        OBJECT_HAS_LEASE => "OBJECT_HAS_LEASE",
        LEASE_EXPIRED => "LEASE_EXPIRED",
        TRANSFER_FAIL => "TRANSFER_FAIL",
        RPC_FAIL => "RPC_FAIL",
        _ => "unknown code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_names_the_path() {
        // SAFETY: the path does not exist, so nothing is loaded.
        let err = unsafe { MooncakeLib::load(Path::new("/nonexistent/libmooncake_store.so")) }
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/libmooncake_store.so"), "{err}");
        assert!(err.contains("store.mooncake.library"), "{err}");
    }

    #[test]
    fn library_without_the_symbols_names_the_symbol() {
        // SAFETY: libc is loaded in every process and has none of Mooncake's functions. Loading it
        // again is sound: it is already initialized.
        let err = unsafe { MooncakeLib::load(Path::new("libc.so.6")) }
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("mooncake_store_create") && err.contains("libc.so.6"),
            "{err}"
        );
    }
}
