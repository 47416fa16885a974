//! Raw bindings to Mooncake Store's C ABI, `store_c.h` (written from the header shipped in the
//! `tokenspeed-mooncake==0.3.13.post20261027` wheel as `mooncake/include/store_c.h`).
//!
//! Nothing is linked at build time: [`MooncakeLib::load`] opens `libmooncake_store.so` from a path
//! chosen by the operator, with `libloading`, and resolves every function up front. So this crate
//! (and jitship) builds and runs on machines with no Mooncake at all, and a missing library or a
//! library without one of the functions is a [`LoadError`] naming the path and the symbol.
//!
//! Before opening it, [`abi::identify`] establishes from the `store_c.h` shipped beside the
//! library which layout of `struct mooncake_replicate_config` it implements, and an unknown or
//! unsupported one is refused ([`LoadError::Abi`]): no call is ever made with the wrong struct.
//!
//! Everything here is as unsafe as the C ABI: pointers and lengths must be valid for each call.
//! The safe wrapper lives in jitship's `store::mooncake`.

#![allow(non_camel_case_types)]

pub mod abi;

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// `typedef void *mooncake_store_t;`: an opaque client handle.
pub type mooncake_store_t = *mut c_void;

/// `struct mooncake_replicate_config` in its with_soft_pin layout
/// ([`abi::ReplicateLayout::WithSoftPin`], the only one [`MooncakeLib::load`] accepts), passed to
/// the put calls (NULL means 1 replica, no pins).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mooncake_replicate_config {
    pub replica_num: usize,
    /// In every library jitship supports (built after kvcache-ai/Mooncake #2909), `store_c.cpp`
    /// maps 1 to the soft-pin action ENABLE: a new soft pin lasting the master's
    /// `default_kv_soft_pin_ttl` from when the write becomes readable, not renewed by reads; and
    /// 0 to PRESERVE: a new object gets no soft pin and an existing object keeps the pin it has
    /// (not "off"). A put of an existing key keeps the old object anyway.
    pub with_soft_pin: c_int,
    /// 1: never evicted; puts fail with NO_AVAILABLE_HANDLE once the pinned objects fill the store.
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
/// The replica a read was pointed at was removed meanwhile (its node died or it was evicted).
pub const REPLICA_IS_GONE: i64 = -712;
/// The object's replicas are in use and cannot be changed now.
pub const OBJECT_REPLICA_BUSY: i64 = -714;
pub const TRANSFER_FAIL: i64 = -800;
pub const CHECKSUM_MISMATCH: i64 = -801;
pub const RPC_FAIL: i64 = -900;
/// The client's deadline for an RPC to the master passed.
pub const RPC_TIMEOUT: i64 = -901;
/// HA: the master is not (yet) the leader, or is recovering.
pub const UNAVAILABLE_IN_CURRENT_STATUS: i64 = -1010;

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
    #[error("refusing the Mooncake Store library {path}: {message}")]
    Abi { path: PathBuf, message: String },
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
    /// The `store_c.h` layout it implements (always a supported one).
    pub abi: abi::Abi,
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

/// Every function jitship resolves: a header must declare them all.
pub const FUNCTIONS: [&str; 17] = [
    "mooncake_store_create",
    "mooncake_store_destroy",
    "mooncake_store_setup",
    "mooncake_store_health_check",
    "mooncake_store_put",
    "mooncake_store_put_from",
    "mooncake_store_batch_put_from",
    "mooncake_store_get_into",
    "mooncake_store_batch_get_into",
    "mooncake_store_is_exist",
    "mooncake_store_batch_is_exist",
    "mooncake_store_get_size",
    "mooncake_store_remove",
    "mooncake_store_remove_by_regex",
    "mooncake_store_remove_all",
    "mooncake_store_register_buffer",
    "mooncake_store_unregister_buffer",
];

static LOADED: OnceLock<Mutex<HashMap<PathBuf, Arc<MooncakeLib>>>> = OnceLock::new();

impl MooncakeLib {
    /// Loads the library at `path` (once per process and path; later calls return the same one),
    /// after establishing its ABI from the header beside it ([`abi::identify`]): an unknown or
    /// unsupported layout is refused before the library is even opened.
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
        // A path that is not there says so, rather than that its header is missing.
        if path.components().count() > 1 && !path.exists() {
            return Err(LoadError::Library {
                path: path.to_owned(),
                message: "no such file".into(),
            });
        }
        let abi = abi::identify(path, &FUNCTIONS).map_err(|message| LoadError::Abi {
            path: path.to_owned(),
            message,
        })?;
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
            abi,
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

/// Every `ErrorCode` of Mooncake Store (`mooncake-store/include/types.h`, kvcache-ai/Mooncake at
/// 2026-08), by value: any of them can come back through the C ABI, which returns the master's
/// and the client's codes as they are.
const CODE_NAMES: &[(i64, &str)] = &[
    (-1, "INTERNAL_ERROR"),
    (-10, "BUFFER_OVERFLOW"),
    (-100, "SHARD_INDEX_OUT_OF_RANGE"),
    (-101, "SEGMENT_NOT_FOUND"),
    (-102, "SEGMENT_ALREADY_EXISTS"),
    (-103, "CLIENT_NOT_FOUND"),
    (-200, "NO_AVAILABLE_HANDLE"),
    (-300, "INVALID_VERSION"),
    (-400, "INVALID_KEY"),
    (-500, "WRITE_FAIL"),
    (-600, "INVALID_PARAMS"),
    (-601, "ILLEGAL_CLIENT"),
    (-700, "INVALID_WRITE"),
    (-701, "INVALID_READ"),
    (-702, "INVALID_REPLICA"),
    (-703, "REPLICA_IS_NOT_READY"),
    (-704, "OBJECT_NOT_FOUND"),
    (-705, "OBJECT_ALREADY_EXISTS"),
    (-706, "OBJECT_HAS_LEASE"),
    (-707, "LEASE_EXPIRED"),
    (-708, "OBJECT_HAS_REPLICATION_TASK"),
    (-709, "OBJECT_NO_REPLICATION_TASK"),
    (-710, "REPLICA_NOT_FOUND"),
    (-711, "REPLICA_ALREADY_EXISTS"),
    (-712, "REPLICA_IS_GONE"),
    (-713, "REPLICA_NOT_IN_LOCAL_MEMORY"),
    (-714, "OBJECT_REPLICA_BUSY"),
    (-800, "TRANSFER_FAIL"),
    (-801, "CHECKSUM_MISMATCH"),
    (-900, "RPC_FAIL"),
    (-901, "RPC_TIMEOUT"),
    (-1000, "ETCD_OPERATION_ERROR"),
    (-1001, "ETCD_KEY_NOT_EXIST"),
    (-1002, "ETCD_TRANSACTION_FAIL"),
    (-1003, "ETCD_CTX_CANCELLED"),
    (-1004, "OPLOG_ENTRY_NOT_FOUND"),
    (-1005, "K8S_LEASE_OPERATION_ERROR"),
    (-1006, "K8S_LEASE_NOT_FOUND"),
    (-1007, "INCOMPLETE_OPLOG_CATCH_UP"),
    (-1010, "UNAVAILABLE_IN_CURRENT_STATUS"),
    (-1011, "UNAVAILABLE_IN_CURRENT_MODE"),
    (-1012, "NOT_SUPPORTED"),
    (-1100, "FILE_NOT_FOUND"),
    (-1101, "FILE_OPEN_FAIL"),
    (-1102, "FILE_READ_FAIL"),
    (-1103, "FILE_WRITE_FAIL"),
    (-1104, "FILE_INVALID_BUFFER"),
    (-1105, "FILE_LOCK_FAIL"),
    (-1106, "FILE_INVALID_HANDLE"),
    (-1200, "BUCKET_NOT_FOUND"),
    (-1201, "BUCKET_ALREADY_EXISTS"),
    (-1202, "KEYS_EXCEED_BUCKET_LIMIT"),
    (-1203, "KEYS_ULTRA_LIMIT"),
    (-1300, "UNABLE_OFFLOAD"),
    (-1301, "UNABLE_OFFLOADING"),
    (-1400, "TASK_NOT_FOUND"),
    (-1401, "TASK_PENDING_LIMIT_EXCEEDED"),
    (-1402, "JOB_NOT_FOUND"),
    (-1500, "SERIALIZE_UNSUPPORTED"),
    (-1501, "SERIALIZE_FAIL"),
    (-1502, "DESERIALIZE_FAIL"),
    (-1503, "PERSISTENT_FAIL"),
    (-1600, "DFS_NETWORK_TIMEOUT"),
    (-1601, "DFS_SERVICE_UNAVAILABLE"),
    (-1602, "DFS_QUOTA_EXCEEDED"),
    (-1603, "DFS_PERMISSION_DENIED"),
    (-1604, "DFS_STALE_HANDLE"),
    (-1605, "DFS_PARTIAL_WRITE"),
    (-1700, "TENANT_QUOTA_EXCEEDED"),
    (-1701, "TENANT_NOT_REGISTERED"),
    (-1702, "TENANT_NOT_EMPTY"),
];

/// A short name for a Mooncake return code, for error messages.
pub fn code_name(code: i64) -> &'static str {
    CODE_NAMES
        .iter()
        .find(|(c, _)| *c == code)
        .map_or("unknown code", |(_, name)| name)
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

    /// The struct of the supported layout, as tokenspeed-mooncake's store_c.h declares it.
    const SUPPORTED_STRUCT: &str = "struct mooncake_replicate_config {\n    size_t replica_num;\n    \
        int with_soft_pin;\n    int with_hard_pin;\n    const char **preferred_segments;\n    \
        size_t preferred_segments_count;\n};\n";

    /// Builds with gcc, in a fresh folder, a stub `libmooncake_store.so` exporting `functions`,
    /// each of which aborts the process if ever called, with a constructor that creates the file
    /// `opened` (so a test sees whether the library was opened at all), and a header
    /// `include/store_c.h` declaring `config_struct` and every function jitship uses.
    fn stub_library(
        config_struct: Option<&str>,
        functions: &[&str],
    ) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let opened = dir.path().join("opened");
        let mut c = format!(
            "#include <stdio.h>\n#include <stdlib.h>\n\
             __attribute__((constructor)) static void opened(void) {{ fclose(fopen(\"{}\", \"w\")); }}\n",
            opened.display()
        );
        for f in functions {
            c.push_str(&format!("void {f}(void) {{ abort(); }}\n"));
        }
        let source = dir.path().join("stub.c");
        std::fs::write(&source, c).unwrap();
        let lib = dir.path().join("libmooncake_store.so");
        let out = std::process::Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(&source)
            .output()
            .expect("gcc runs");
        assert!(
            out.status.success(),
            "gcc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(s) = config_struct {
            let mut h = format!("#include <stddef.h>\n#include <stdint.h>\n{s}");
            for f in FUNCTIONS {
                h.push_str(&format!("int {f}(void *store);\n"));
            }
            std::fs::create_dir(dir.path().join("include")).unwrap();
            std::fs::write(dir.path().join("include/store_c.h"), h).unwrap();
        }
        (dir, lib)
    }

    #[test]
    fn unknown_layout_is_refused_before_the_library_is_opened() {
        let unknown = SUPPORTED_STRUCT.replace(
            "int with_hard_pin;",
            "int with_hard_pin;\n    int with_pin_v3;",
        );
        let (dir, lib) = stub_library(Some(&unknown), &FUNCTIONS);
        // SAFETY: the stub's functions abort if called; refusing it calls none of them.
        let err = unsafe { MooncakeLib::load(&lib) }.unwrap_err().to_string();
        assert!(
            err.contains(&lib.display().to_string())
                && err.contains("unknown layout")
                && err.contains("int with_pin_v3")
                && err.contains("jitship supports the with_soft_pin layout"),
            "{err}"
        );
        assert!(
            !dir.path().join("opened").exists(),
            "the library was opened"
        );
    }

    #[test]
    fn soft_pin_action_layout_is_named_and_refused() {
        let newer = "struct mooncake_replicate_config {\n    size_t replica_num;\n    int with_hard_pin;\n    \
            const char **preferred_segments;\n    size_t preferred_segments_count;\n    int soft_pin_action;\n    \
            int has_soft_pin_ttl;\n    uint64_t soft_pin_ttl_ms;\n};\n";
        let (dir, lib) = stub_library(Some(newer), &FUNCTIONS);
        // SAFETY: as above.
        let err = unsafe { MooncakeLib::load(&lib) }.unwrap_err().to_string();
        assert!(
            err.contains("#3881") && err.contains(&lib.display().to_string()),
            "{err}"
        );
        assert!(!dir.path().join("opened").exists());
    }

    #[test]
    fn library_without_a_header_is_refused() {
        let (dir, lib) = stub_library(None, &FUNCTIONS);
        // SAFETY: as above.
        let err = unsafe { MooncakeLib::load(&lib) }.unwrap_err().to_string();
        assert!(
            err.contains("no store_c.h beside it") && err.contains("include/store_c.h"),
            "{err}"
        );
        assert!(!dir.path().join("opened").exists());
    }

    #[test]
    fn supported_layout_loads_and_nothing_is_called() {
        let (dir, lib) = stub_library(Some(SUPPORTED_STRUCT), &FUNCTIONS);
        // SAFETY: loading runs only the stub's constructor; no function is called (they abort).
        let loaded = unsafe { MooncakeLib::load(&lib) }.unwrap();
        assert_eq!(loaded.abi.layout, abi::ReplicateLayout::WithSoftPin);
        assert_eq!(
            loaded.abi.header,
            dir.path().join("include/store_c.h").canonicalize().unwrap()
        );
        assert!(dir.path().join("opened").exists());
    }

    #[test]
    fn library_without_the_symbols_names_the_symbol() {
        let (_dir, lib) = stub_library(Some(SUPPORTED_STRUCT), &FUNCTIONS[..16]);
        // SAFETY: as above.
        let err = unsafe { MooncakeLib::load(&lib) }.unwrap_err().to_string();
        assert!(
            err.contains("mooncake_store_unregister_buffer")
                && err.contains(&lib.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn every_code_has_a_name() {
        for code in [
            LEASE_EXPIRED,
            REPLICA_IS_GONE,
            RPC_TIMEOUT,
            UNAVAILABLE_IN_CURRENT_STATUS,
            -1702,
        ] {
            assert_ne!(code_name(code), "unknown code", "{code}");
        }
        assert_eq!(code_name(LEASE_EXPIRED), "LEASE_EXPIRED");
        assert_eq!(code_name(-5), "unknown code");
    }
}
