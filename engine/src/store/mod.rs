//! Where generations live. The contract below is what Mooncake Store gives, so every backend
//! (the embedded `local` directory, `mooncake`) implements exactly it and runs the same
//! `conformance` suite. A store knows keys and bytes; it knows nothing of policies or manifests.
//!
//! Contract:
//! - `put` is immutable: a put on an existing key succeeds and keeps the OLD value. No overwrite,
//!   no compare-and-swap.
//! - every `get` may miss (`Ok(None)`): eviction is silent. A miss is not an error.
//! - `remove` of a missing key is `Ok(false)`.
//! - batched calls return one result per key, in order; one key failing does not fail the others.
//! - `list` is optional (Mooncake has no listing): backends without it return `Unsupported`.
//! - values are at most `max_value_size()` bytes (packs are planned below it).

pub mod conformance;
pub mod keys;
pub mod local;

use std::fmt;

pub use keys::KeyLayout;
pub use local::LocalStore;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached or answered with a failure that may pass (master or node down).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store is full: {0}")]
    NoSpace(String),
    #[error("value of {size} bytes is over the store's limit of {limit} bytes")]
    TooLarge { size: u64, limit: u64 },
    #[error("invalid key {0:?}")]
    InvalidKey(String),
    #[error("the key is leased by a reader and cannot be removed now: {0}")]
    Leased(String),
    #[error("{0} is not supported by this store")]
    Unsupported(&'static str),
    #[error("store call timed out after {0:?}")]
    Timeout(std::time::Duration),
    #[error("store I/O error on {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("store error: {0}")]
    Other(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A key/value store with Mooncake's semantics (see the module docs).
pub trait Store: Send + Sync + fmt::Debug {
    /// Human description for logs and errors ("local:/var/lib/jitship", "mooncake:127.0.0.1:50051").
    fn describe(&self) -> String;

    /// Largest value `put` accepts.
    fn max_value_size(&self) -> u64;

    /// Stores `value` under `key` unless the key exists, in which case the old value is kept and
    /// the call still succeeds.
    fn put(&self, key: &str, value: &[u8]) -> StoreResult<()>;

    /// The value, or `None` if the key is missing (never stored, removed or evicted).
    fn get(&self, key: &str) -> StoreResult<Option<Vec<u8>>>;

    fn exists(&self, key: &str) -> StoreResult<bool>;

    /// Removes `key`; `Ok(false)` if it was not there.
    fn remove(&self, key: &str) -> StoreResult<bool>;

    /// Keys starting with `prefix`, in no particular order. Optional.
    fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        let _ = prefix;
        Err(StoreError::Unsupported("listing keys"))
    }

    fn put_batch(&self, items: &[(&str, &[u8])]) -> Vec<StoreResult<()>> {
        items.iter().map(|(k, v)| self.put(k, v)).collect()
    }

    fn get_batch(&self, keys: &[&str]) -> Vec<StoreResult<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(k)).collect()
    }

    fn exists_batch(&self, keys: &[&str]) -> Vec<StoreResult<bool>> {
        keys.iter().map(|k| self.exists(k)).collect()
    }
}

/// Keys are printable ASCII without spaces, at most 512 bytes, `/`-separated segments that are
/// neither empty nor `.`/`..` (so the local backend can map them to paths safely).
pub fn check_key(key: &str) -> StoreResult<()> {
    let ok = !key.is_empty()
        && key.len() <= 512
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.+=/".contains(&b))
        && key
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..");
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidKey(key.to_owned()))
    }
}

/// Opens the store the configuration names.
pub fn open(config: &crate::config::StoreConfig) -> StoreResult<std::sync::Arc<dyn Store>> {
    match config.backend {
        crate::config::Backend::Local => {
            Ok(std::sync::Arc::new(LocalStore::open(&config.local.path)?))
        }
    }
}
