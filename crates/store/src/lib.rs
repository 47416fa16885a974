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
//! - `list`, `modified` and `size` are optional (Mooncake has none of them): `capabilities()`
//!   says which a backend answers; the others return `Unsupported`.
//! - `put` carries a `ValueClass` (record or bulk): backends may keep records longer, but never
//!   decide that from the shape of a key.
//! - values are at most `max_value_size()` bytes (packs are planned below it).

pub mod conformance;
pub mod local;
mod mooncake;
pub mod settings;
pub mod tiered;

use std::fmt;
use std::sync::Arc;

pub use local::LocalStore;
pub use mooncake::{MooncakeStore, defer_teardowns, wait_for_teardowns};
pub use settings::{Backend, DurableStoreConfig, StoreConfig};
pub use tiered::{TierStats, TieredStore};

/// `Clone`, so a batched call that fails as a whole can give every key its own copy.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached or answered with a failure that may pass (master or node down).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Mooncake: the master does not answer (down, restarting, unreachable). Retry later.
    #[error("store master unavailable: {0}")]
    MasterDown(String),
    /// Mooncake: a store node holding the object does not answer (its keys read as missing once
    /// the master notices). Retry later.
    #[error("store node unavailable: {0}")]
    NodeDown(String),
    #[error("store is full: {0}")]
    NoSpace(String),
    #[error("value of {size} bytes is over the store's limit of {limit} bytes")]
    TooLarge { size: u64, limit: u64 },
    #[error("invalid key {0:?}")]
    InvalidKey(String),
    #[error("the key is leased by a reader and cannot be removed now: {0}")]
    Leased(String),
    /// Mooncake: a read outlived the lease the master gave it (node or client overloaded). The
    /// backend reads again a few times before it returns this.
    #[error("the read outlived its lease: {0}")]
    LeaseExpired(String),
    #[error("{0} is not supported by this store")]
    Unsupported(&'static str),
    #[error("store call timed out after {0:?}")]
    Timeout(std::time::Duration),
    #[error("store I/O error on {path}: {source}")]
    Io {
        path: String,
        /// Shared, as `io::Error` is not `Clone`.
        source: Arc<std::io::Error>,
    },
    #[error("store error: {0}")]
    Other(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// What a stored value is. A hint from the layer that knows (the catalog), so no backend has to
/// guess it from the shape of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueClass {
    /// A small record readers navigate by (heads, manifests, index, floors, pins, journals).
    /// Mooncake soft-pins these (`soft_pin_catalog`) so eviction takes bulk data first.
    Record,
    /// Bulk data (packs).
    Bulk,
}

/// The optional calls a backend answers. A caller asks here instead of calling and matching
/// `Unsupported`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// `list` works.
    pub listing: bool,
    /// `modified` works.
    pub write_times: bool,
    /// `size` works.
    pub sizes: bool,
}

/// A key/value store with Mooncake's semantics (see the module docs).
pub trait Store: Send + Sync + fmt::Debug {
    /// Human description for logs and errors ("local:/var/lib/jitship", "mooncake:127.0.0.1:50051").
    fn describe(&self) -> String;

    /// Largest value `put` accepts.
    fn max_value_size(&self) -> u64;

    /// What this backend offers beyond the required calls.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Stores `value` under `key` unless the key exists, in which case the old value is kept and
    /// the call still succeeds. `class` says what the value is, for backends that keep records
    /// longer than bulk data.
    fn put(&self, key: &str, value: &[u8], class: ValueClass) -> StoreResult<()>;

    /// `put` of copy `copy` of a value kept under several keys (`[publish] pack_replicas`): a
    /// backend with several nodes places each copy on a different one where it can, so reads
    /// that pick a copy at random spread over the nodes.
    fn put_copy(&self, key: &str, value: &[u8], class: ValueClass, copy: u32) -> StoreResult<()> {
        let _ = copy;
        self.put(key, value, class)
    }

    /// The value, or `None` if the key is missing (never stored, removed or evicted).
    fn get(&self, key: &str) -> StoreResult<Option<Vec<u8>>>;

    /// The value, or `None` if it is missing; `TooLarge` if it is over `limit` bytes, refused
    /// before it is read whole where the backend can tell its size first. Every record read from
    /// a store others can write to goes through here, so a hostile 2 GiB record costs nothing.
    fn get_capped(&self, key: &str, limit: u64) -> StoreResult<Option<Vec<u8>>> {
        if self.capabilities().sizes {
            match self.size(key) {
                Ok(None) => return Ok(None),
                Ok(Some(size)) if size > limit => {
                    return Err(StoreError::TooLarge { size, limit });
                }
                Ok(Some(_)) | Err(StoreError::Unsupported(_)) => {}
                Err(e) => return Err(e),
            }
        }
        match self.get(key)? {
            Some(v) if v.len() as u64 > limit => Err(StoreError::TooLarge {
                size: v.len() as u64,
                limit,
            }),
            other => Ok(other),
        }
    }

    /// Stores a value of `len` bytes that `fill` writes in place, like `put` otherwise (on
    /// Mooncake straight into a registered staging buffer, so a pack is never held twice).
    /// `fill` must write all `len` bytes; when it returns false nothing is stored and the result
    /// is `Ok(false)` (the caller keeps its own reason).
    fn put_filled(
        &self,
        key: &str,
        len: usize,
        class: ValueClass,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> StoreResult<bool> {
        let mut value = vec![0u8; len];
        if !fill(&mut value) {
            return Ok(false);
        }
        self.put(key, &value, class).map(|()| true)
    }

    fn exists(&self, key: &str) -> StoreResult<bool>;

    /// Removes `key`; `Ok(false)` if it was not there.
    fn remove(&self, key: &str) -> StoreResult<bool>;

    /// Keys starting with `prefix`, in no particular order. Optional (`Capabilities::listing`).
    fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        let _ = prefix;
        Err(StoreError::Unsupported("listing keys"))
    }

    /// When `key` was written, `None` if it is missing. Optional (gc uses it on listing stores to
    /// leave alone what a publish in progress just wrote).
    fn modified(&self, key: &str) -> StoreResult<Option<std::time::SystemTime>> {
        let _ = key;
        Err(StoreError::Unsupported("write times"))
    }

    /// The size of the value under `key`, `None` if it is missing. Optional (gc reports the bytes
    /// of orphans it found by listing with it).
    fn size(&self, key: &str) -> StoreResult<Option<u64>> {
        let _ = key;
        Err(StoreError::Unsupported("value sizes"))
    }

    fn put_batch(&self, items: &[(&str, &[u8])], class: ValueClass) -> Vec<StoreResult<()>> {
        items.iter().map(|(k, v)| self.put(k, v, class)).collect()
    }

    fn get_batch(&self, keys: &[&str]) -> Vec<StoreResult<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(k)).collect()
    }

    fn exists_batch(&self, keys: &[&str]) -> Vec<StoreResult<bool>> {
        keys.iter().map(|k| self.exists(k)).collect()
    }

    /// Values of `items`, each `(key, expected size)` (as a manifest records a pack), in as few
    /// calls as the backend can make. A value of another size is returned as it is: the caller
    /// checks. The values may still sit in the backend's transfer memory (`Fetched`), so a caller
    /// asks for about `max_value_size()` bytes at a time and holds few batches at once.
    fn get_sized_batch(&self, items: &[(&str, u64)]) -> Vec<StoreResult<Option<Fetched>>> {
        let keys: Vec<&str> = items.iter().map(|(k, _)| *k).collect();
        self.get_batch(&keys)
            .into_iter()
            .map(|r| r.map(|v| v.map(Fetched::from)))
            .collect()
    }

    /// What each tier served, for a store of two tiers (`TieredStore`); `None` for one.
    fn tier_stats(&self) -> Option<TierStats> {
        None
    }

    /// `(fast, durable)` for a store of two tiers (`TieredStore`), so publish can make the
    /// durable tier hold every pack a head names and `verify` can check each tier on its own;
    /// `None` for one.
    fn tiers(&self) -> Option<(&dyn Store, &dyn Store)> {
        None
    }
}

/// A value read by `Store::get_sized_batch`: an owned vector, or a slice of the backend's
/// registered transfer memory (Mooncake), handed back to the backend when dropped. Install writes
/// files straight from it instead of copying every pack into a vector first.
pub struct Fetched(Box<dyn AsRef<[u8]> + Send>);

impl Fetched {
    /// Wraps bytes held elsewhere (a backend's buffer, released when `bytes` is dropped).
    pub fn new(bytes: impl AsRef<[u8]> + Send + 'static) -> Self {
        Self(Box::new(bytes))
    }
}

impl From<Vec<u8>> for Fetched {
    fn from(v: Vec<u8>) -> Self {
        Self::new(v)
    }
}

impl std::ops::Deref for Fetched {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

impl fmt::Debug for Fetched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fetched({} bytes)", self.len())
    }
}

impl StoreError {
    /// True for failures that may pass by themselves (a node or master down, a timeout).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Unavailable(_)
                | Self::MasterDown(_)
                | Self::NodeDown(_)
                | Self::Timeout(_)
                | Self::LeaseExpired(_)
        )
    }
}

/// Opens the store `config` selects: the local directory, or a connection to a Mooncake cluster
/// (which fails within `store.mooncake.probe_timeout` when the master is unreachable).
pub fn open(config: &StoreConfig) -> Result<Arc<dyn Store>, StoreError> {
    let fast: Arc<dyn Store> = match config.backend {
        Backend::Local => Arc::new(LocalStore::open(&config.local.path)?),
        Backend::Mooncake if config.durable.path.is_some() => {
            // The durable tier answers at once where Mooncake fails; tries again would delay it.
            let retry_for = std::time::Duration::ZERO;
            let mooncake = settings::MooncakeConfig {
                retry_for,
                ..config.mooncake.clone()
            };
            Arc::new(MooncakeStore::connect(&mooncake)?)
        }
        Backend::Mooncake => Arc::new(MooncakeStore::connect(&config.mooncake)?),
    };
    with_durable_tier(fast, config, |p| LocalStore::open(p))
}

/// `fast` over the durable tier `config` names (`[store.durable]`), if any, opened with
/// `open_dir` (a command that only reads never creates the directory). A durable registry tier
/// (`[store.durable] registry`) is not a `Store`: it is refused here, never dropped silently; the
/// caller opens it beside the store (`jitship_oci::Registry`) and passes a config without it.
pub fn with_durable_tier(
    fast: Arc<dyn Store>,
    config: &StoreConfig,
    open_dir: impl FnOnce(&std::path::Path) -> Result<LocalStore, StoreError>,
) -> Result<Arc<dyn Store>, StoreError> {
    if let Some(registry) = &config.durable.registry {
        return Err(StoreError::Other(format!(
            "the durable registry tier {registry:?} ([store.durable] registry) is not opened by \
             store::open: open it beside the store (oci::Registry::open) and pass the store \
             settings without it"
        )));
    }
    match &config.durable.path {
        None => Ok(fast),
        Some(path) => {
            let durable: Arc<dyn Store> = Arc::new(open_dir(path)?);
            Ok(Arc::new(TieredStore::new(fast, durable)))
        }
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

/// Store wrappers for tests and drills: the local store made to behave more like Mooncake.
pub mod testing {
    use std::time::Duration;

    use super::{Capabilities, Store, StoreError, StoreResult, ValueClass};

    /// Hides `list` and `modified`, so code paths for stores without listing (Mooncake) run on
    /// the local store.
    #[derive(Debug)]
    pub struct WithoutListing<S>(pub S);

    impl<S: Store> Store for WithoutListing<S> {
        fn describe(&self) -> String {
            format!("{} (listing hidden)", self.0.describe())
        }
        fn max_value_size(&self) -> u64 {
            self.0.max_value_size()
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities {
                listing: false,
                write_times: false,
                ..self.0.capabilities()
            }
        }
        fn put(&self, key: &str, value: &[u8], class: ValueClass) -> StoreResult<()> {
            self.0.put(key, value, class)
        }
        fn get(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
            self.0.get(key)
        }
        fn get_capped(&self, key: &str, limit: u64) -> StoreResult<Option<Vec<u8>>> {
            self.0.get_capped(key, limit)
        }
        fn exists(&self, key: &str) -> StoreResult<bool> {
            self.0.exists(key)
        }
        fn remove(&self, key: &str) -> StoreResult<bool> {
            self.0.remove(key)
        }
        fn list(&self, _prefix: &str) -> StoreResult<Vec<String>> {
            Err(StoreError::Unsupported("listing keys"))
        }
    }

    type PutHook<S, T> =
        Box<dyn Fn(&S, &T, &str, &[u8], ValueClass) -> StoreResult<()> + Send + Sync>;
    type GetHook<S, T> = Box<dyn Fn(&S, &T, &str) -> StoreResult<Option<Vec<u8>>> + Send + Sync>;
    type KeyHook<S, T> = Box<dyn Fn(&S, &T, &str) -> StoreResult<bool> + Send + Sync>;

    /// A store that does what a test makes it do: `put`, `get`, `exists` and `remove` run the
    /// hook set for them (given `inner` to forward to, and the test's `state`), or go to `inner`.
    /// Everything else goes to `inner`, except the batched calls: they keep the trait's defaults,
    /// which go through the single calls, so a hook sees every key. Hide listing by making
    /// `inner` a [`WithoutListing`].
    pub struct Hooked<S, T = ()> {
        pub inner: S,
        pub state: T,
        put: Option<PutHook<S, T>>,
        get: Option<GetHook<S, T>>,
        exists: Option<KeyHook<S, T>>,
        remove: Option<KeyHook<S, T>>,
    }

    impl<S: Store, T> Hooked<S, T> {
        pub fn new(inner: S, state: T) -> Self {
            Self {
                inner,
                state,
                put: None,
                get: None,
                exists: None,
                remove: None,
            }
        }

        pub fn on_put(
            mut self,
            hook: impl Fn(&S, &T, &str, &[u8], ValueClass) -> StoreResult<()> + Send + Sync + 'static,
        ) -> Self {
            self.put = Some(Box::new(hook));
            self
        }

        pub fn on_get(
            mut self,
            hook: impl Fn(&S, &T, &str) -> StoreResult<Option<Vec<u8>>> + Send + Sync + 'static,
        ) -> Self {
            self.get = Some(Box::new(hook));
            self
        }

        pub fn on_exists(
            mut self,
            hook: impl Fn(&S, &T, &str) -> StoreResult<bool> + Send + Sync + 'static,
        ) -> Self {
            self.exists = Some(Box::new(hook));
            self
        }

        pub fn on_remove(
            mut self,
            hook: impl Fn(&S, &T, &str) -> StoreResult<bool> + Send + Sync + 'static,
        ) -> Self {
            self.remove = Some(Box::new(hook));
            self
        }
    }

    impl<S: std::fmt::Debug, T: std::fmt::Debug> std::fmt::Debug for Hooked<S, T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Hooked")
                .field("inner", &self.inner)
                .field("state", &self.state)
                .field("put", &self.put.is_some())
                .field("get", &self.get.is_some())
                .field("exists", &self.exists.is_some())
                .field("remove", &self.remove.is_some())
                .finish()
        }
    }

    impl<S: Store, T: std::fmt::Debug + Send + Sync> Store for Hooked<S, T> {
        fn describe(&self) -> String {
            format!("{} (hooked)", self.inner.describe())
        }
        fn max_value_size(&self) -> u64 {
            self.inner.max_value_size()
        }
        fn capabilities(&self) -> Capabilities {
            self.inner.capabilities()
        }
        fn put(&self, key: &str, value: &[u8], class: ValueClass) -> StoreResult<()> {
            match &self.put {
                Some(hook) => hook(&self.inner, &self.state, key, value, class),
                None => self.inner.put(key, value, class),
            }
        }
        fn get(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
            match &self.get {
                Some(hook) => hook(&self.inner, &self.state, key),
                None => self.inner.get(key),
            }
        }
        fn get_capped(&self, key: &str, limit: u64) -> StoreResult<Option<Vec<u8>>> {
            if self.get.is_some() {
                // Through the hook, checked once read.
                return match self.get(key)? {
                    Some(v) if v.len() as u64 > limit => Err(StoreError::TooLarge {
                        size: v.len() as u64,
                        limit,
                    }),
                    other => Ok(other),
                };
            }
            self.inner.get_capped(key, limit)
        }
        fn exists(&self, key: &str) -> StoreResult<bool> {
            match &self.exists {
                Some(hook) => hook(&self.inner, &self.state, key),
                None => self.inner.exists(key),
            }
        }
        fn remove(&self, key: &str) -> StoreResult<bool> {
            match &self.remove {
                Some(hook) => hook(&self.inner, &self.state, key),
                None => self.inner.remove(key),
            }
        }
        fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
            self.inner.list(prefix)
        }
        fn modified(&self, key: &str) -> StoreResult<Option<std::time::SystemTime>> {
            self.inner.modified(key)
        }
        fn size(&self, key: &str) -> StoreResult<Option<u64>> {
            self.inner.size(key)
        }
    }

    /// Delays every `get` of a key `slow` picks by `delay`, to hold a read in progress (an
    /// install, with `slow` picking its pack keys: which keys those are is the caller's layout).
    pub fn slow_gets<S: Store>(
        inner: S,
        delay: Duration,
        slow: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Hooked<S, Duration> {
        Hooked::new(inner, delay).on_get(move |inner, delay, key| {
            if slow(key) {
                std::thread::sleep(*delay);
            }
            inner.get(key)
        })
    }

    impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
        fn describe(&self) -> String {
            (**self).describe()
        }
        fn max_value_size(&self) -> u64 {
            (**self).max_value_size()
        }
        fn capabilities(&self) -> Capabilities {
            (**self).capabilities()
        }
        fn put(&self, key: &str, value: &[u8], class: ValueClass) -> StoreResult<()> {
            (**self).put(key, value, class)
        }
        fn get(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
            (**self).get(key)
        }
        fn get_capped(&self, key: &str, limit: u64) -> StoreResult<Option<Vec<u8>>> {
            (**self).get_capped(key, limit)
        }
        fn put_filled(
            &self,
            key: &str,
            len: usize,
            class: ValueClass,
            fill: &mut dyn FnMut(&mut [u8]) -> bool,
        ) -> StoreResult<bool> {
            (**self).put_filled(key, len, class, fill)
        }
        fn exists(&self, key: &str) -> StoreResult<bool> {
            (**self).exists(key)
        }
        fn remove(&self, key: &str) -> StoreResult<bool> {
            (**self).remove(key)
        }
        fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
            (**self).list(prefix)
        }
        fn modified(&self, key: &str) -> StoreResult<Option<std::time::SystemTime>> {
            (**self).modified(key)
        }
        fn size(&self, key: &str) -> StoreResult<Option<u64>> {
            (**self).size(key)
        }
        fn put_batch(&self, items: &[(&str, &[u8])], class: ValueClass) -> Vec<StoreResult<()>> {
            (**self).put_batch(items, class)
        }
        fn get_batch(&self, keys: &[&str]) -> Vec<StoreResult<Option<Vec<u8>>>> {
            (**self).get_batch(keys)
        }
        fn exists_batch(&self, keys: &[&str]) -> Vec<StoreResult<bool>> {
            (**self).exists_batch(keys)
        }
        fn get_sized_batch(
            &self,
            items: &[(&str, u64)],
        ) -> Vec<StoreResult<Option<super::Fetched>>> {
            (**self).get_sized_batch(items)
        }
        fn tier_stats(&self) -> Option<super::TierStats> {
            (**self).tier_stats()
        }
        fn tiers(&self) -> Option<(&dyn Store, &dyn Store)> {
            (**self).tiers()
        }
    }
}
