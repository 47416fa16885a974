//! On-disk cache of compiled policies (`.cwasm`), so a start costs a fraction of a millisecond
//! instead of a Cranelift compile.
//!
//! Loading a `.cwasm` is loading native code: wasmtime trusts it. So this cache only ever loads files
//! jitship wrote itself: its directory is created 0700 and must be owned by this user and writable by
//! nobody else; each file must be a regular file (not a symlink), owned by this user, not writable by
//! group or others, with a single link. A file is keyed by the blake3 of the component it was
//! compiled from and by the engine's compatibility hash (wasmtime version, target, tunables,
//! features), so another build's artifacts are never even opened. Any load error is a miss: the file
//! is removed and the component recompiled.

use std::hash::Hash;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use jitship_generation::ContentHasher;

use wasmtime::Engine;
use wasmtime::component::Component;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cannot create or inspect the policy compile cache {dir}: {source}")]
    Io {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "refusing the policy compile cache {dir}: {why}; compiled policies are native code, so the directory \
         must belong to this user (uid {uid}) and be writable by nobody else. Fix its owner/mode, or set \
         [policy] cache_dir elsewhere"
    )]
    Untrusted { dir: PathBuf, why: String, uid: u32 },
}

/// Bumped if the file layout changes, so old files are simply never looked up.
const LAYOUT: &str = "jitship-policy-cwasm-v1";

pub struct CompileCache {
    dir: PathBuf,
    engine_key: String,
}

/// Feeds `Hash` into a content hash, so the engine key is full width and does not depend on
/// std's unspecified `DefaultHasher`.
struct KeyHasher(ContentHasher);

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    fn finish(&self) -> u64 {
        let h = self.0.finish();
        u64::from_le_bytes(h.0[..8].try_into().unwrap_or([0; 8]))
    }
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

impl CompileCache {
    /// Opens (creating if needed) the cache in `dir` for `engine`, after checking the directory can
    /// be trusted.
    pub fn open(dir: &Path, engine: &Engine) -> Result<Self, CacheError> {
        let io = |source| CacheError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(e)),
        }
        let meta = std::fs::symlink_metadata(dir).map_err(io)?;
        let uid = euid();
        let untrusted = |why: String| CacheError::Untrusted {
            dir: dir.to_path_buf(),
            why,
            uid,
        };
        if !meta.file_type().is_dir() {
            return Err(untrusted("it is not a directory (or is a symlink)".into()));
        }
        if meta.uid() != uid {
            return Err(untrusted(format!("it is owned by uid {}", meta.uid())));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(untrusted(format!(
                "it is writable by group or others (mode {:o})",
                meta.mode() & 0o777
            )));
        }
        let mut hasher = KeyHasher(ContentHasher::new());
        LAYOUT.hash(&mut hasher);
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_key = hasher.0.finish().short_hex(32);
        Ok(Self {
            dir: dir.to_path_buf(),
            engine_key,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path_for(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{}.cwasm", self.engine_key))
    }

    /// The compiled component for the module with blake3 `digest`, if this cache holds a
    /// trustworthy one that this engine accepts.
    ///
    /// The file is opened without following links, checked through that same descriptor, and read
    /// into memory: checking one path and mapping another would leave a window to swap the file,
    /// and a mapped file truncated in place (by anything running as this user) would crash the
    /// process with SIGBUS, which a copy cannot. The copy costs ~0.2 ms per load.
    pub fn load(&self, engine: &Engine, digest: &str) -> Option<Component> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.path_for(digest);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .ok()?;
        let meta = file.metadata().ok()?;
        let trusted = meta.file_type().is_file()
            && meta.uid() == euid()
            && meta.mode() & 0o022 == 0
            && meta.nlink() == 1;
        if !trusted {
            tracing::warn!(path = %path.display(), "ignoring a compiled policy jitship did not write (owner, mode or links differ); recompiling");
            let _ = std::fs::remove_file(&path);
            return None;
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        std::io::Read::read_to_end(&mut file, &mut bytes).ok()?;
        // SAFETY: deserializing trusts the bytes as native code. It is sound here because they come
        // from a file this user wrote through `store`: nobody else can write into the directory
        // (`open` checked it belongs to this user and is not group/other-writable), and the file
        // itself, checked through the descriptor we read, is a regular single-link file owned by
        // this user and not writable by others. It was produced by `Engine::precompile_component`
        // from the module whose blake3 is in its name, and the engine compatibility hash in its
        // name (plus wasmtime's own header check) rules out another wasmtime version or config.
        match unsafe { Component::deserialize(engine, &bytes) } {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "compiled policy unusable; recompiling");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Keeps `cwasm` (from `Engine::precompile_component`) for the module with blake3 `digest`.
    /// Written to a temp file (mode 0600) and renamed, so a concurrent reader never sees half a file.
    pub fn store(&self, digest: &str, cwasm: &[u8]) -> std::io::Result<()> {
        let mut tmp = tempfile::Builder::new()
            .prefix(".tmp-")
            .tempfile_in(&self.dir)?;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o600))?;
        std::io::Write::write_all(&mut tmp, cwasm)?;
        tmp.as_file().sync_all()?;
        tmp.persist(self.path_for(digest)).map_err(|e| e.error)?;
        Ok(())
    }
}
