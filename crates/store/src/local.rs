//! The embedded store: one file per key under a directory. Same contract as Mooncake, plus
//! listing. Writes go to a temp file, are fsynced, then hard-linked into place with
//! `persist_noclobber` (link(2) fails if the key exists, which is exactly the immutable put, even
//! with several processes writing at once), then the directory is fsynced.

use std::fs;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use super::{Capabilities, Store, StoreError, StoreResult, ValueClass, check_key};

const TMP_DIR: &str = ".tmp";

/// A temp file untouched this long belongs to a put that died (a put writes, fsyncs and links its
/// temp file within one call, and every write refreshes its mtime): opening the store removes it.
pub const STALE_TEMP_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

#[derive(Debug)]
pub struct LocalStore {
    root: PathBuf,
    /// Puts are fsynced (false only for `scratch`).
    durable: bool,
}

impl LocalStore {
    /// A store in `root` (created) for data that dies with the process using it (what an install
    /// pulled from the registry tier, read once): puts are not fsynced.
    pub fn scratch(root: impl Into<PathBuf>) -> StoreResult<Self> {
        let root = root.into();
        fs::create_dir_all(root.join(TMP_DIR)).map_err(|e| io_err(&root, e))?;
        Ok(Self {
            root,
            durable: false,
        })
    }

    /// Opens (and creates) the store directory.
    pub fn open(root: impl Into<PathBuf>) -> StoreResult<Self> {
        let root = root.into();
        fs::create_dir_all(root.join(TMP_DIR)).map_err(|e| io_err(&root, e))?;
        let store = Self {
            root,
            durable: true,
        };
        // Every command that writes (publish, gc) opens the store first, so killed puts never
        // accumulate; failing to clean is not a reason to refuse the store.
        if let Err(e) = store.remove_stale_temp(STALE_TEMP_AGE) {
            tracing::warn!("cleaning {}: {e}", store.root.join(TMP_DIR).display());
        }
        Ok(store)
    }

    /// Opens an existing store directory for reading, creating and removing nothing (the
    /// read-only commands: ls, inspect, verify). A missing directory is an error naming it.
    pub fn open_existing(root: impl Into<PathBuf>) -> StoreResult<Self> {
        let root = root.into();
        match fs::metadata(&root) {
            Ok(m) if m.is_dir() => Ok(Self {
                root,
                durable: true,
            }),
            Ok(_) => Err(StoreError::Other(format!(
                "the local store {} is not a directory",
                root.display()
            ))),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(StoreError::Other(format!(
                "the local store {} does not exist (nothing was published to it yet, or the \
                 path is mistyped); this command only reads and does not create it",
                root.display()
            ))),
            Err(e) => Err(io_err(&root, e)),
        }
    }

    /// Removes temp files of puts that died (not modified for `older_than`); returns how many.
    pub fn remove_stale_temp(&self, older_than: std::time::Duration) -> std::io::Result<u64> {
        let dir = self.root.join(TMP_DIR);
        let mut removed = 0;
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            let stale = meta
                .modified()?
                .elapsed()
                .is_ok_and(|age| age >= older_than);
            if meta.is_file() && stale {
                match fs::remove_file(entry.path()) {
                    Ok(()) => removed += 1,
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if removed > 0 {
            tracing::info!(
                removed,
                "removed temp files of interrupted puts from the local store"
            );
        }
        Ok(removed)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path_of(&self, key: &str) -> StoreResult<PathBuf> {
        check_key(key)?;
        if key == TMP_DIR || key.starts_with(".tmp/") {
            return Err(StoreError::InvalidKey(key.to_owned()));
        }
        Ok(self.root.join(key))
    }
}

fn io_err(path: &Path, e: std::io::Error) -> StoreError {
    if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT) {
        StoreError::NoSpace(format!("{}: {e}", path.display()))
    } else {
        StoreError::Io {
            path: path.display().to_string(),
            source: std::sync::Arc::new(e),
        }
    }
}

impl Store for LocalStore {
    fn describe(&self) -> String {
        format!("local:{}", self.root.display())
    }

    fn max_value_size(&self) -> u64 {
        u64::from(u32::MAX)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            listing: true,
            write_times: true,
            sizes: true,
        }
    }

    /// Every class alike: a directory evicts nothing.
    fn put(&self, key: &str, value: &[u8], _class: ValueClass) -> StoreResult<()> {
        let path = self.path_of(key)?;
        if value.len() as u64 > self.max_value_size() {
            return Err(StoreError::TooLarge {
                size: value.len() as u64,
                limit: self.max_value_size(),
            });
        }
        if path.exists() {
            return Ok(());
        }
        let dir = path.parent().expect("keys have a namespace segment");
        fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        let tmp_dir = self.root.join(TMP_DIR);
        let mut tmp = tempfile::NamedTempFile::new_in(&tmp_dir).map_err(|e| io_err(&tmp_dir, e))?;
        tmp.write_all(value).map_err(|e| io_err(tmp.path(), e))?;
        if self.durable {
            tmp.as_file()
                .sync_all()
                .map_err(|e| io_err(tmp.path(), e))?;
        }
        match tmp.persist_noclobber(&path) {
            Ok(_) => {}
            Err(e) if e.error.kind() == ErrorKind::AlreadyExists => return Ok(()),
            Err(e) => return Err(io_err(&path, e.error)),
        }
        if !self.durable {
            return Ok(());
        }
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err(dir, e))
    }

    fn get(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
        let path = self.path_of(key)?;
        match fs::read(&path) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::EISDIR) => Ok(None),
            Err(e) => Err(io_err(&path, e)),
        }
    }

    /// Reads the size from the open file before reading it, so an oversized value is refused
    /// without being read.
    fn get_capped(&self, key: &str, limit: u64) -> StoreResult<Option<Vec<u8>>> {
        use std::io::Read;
        let path = self.path_of(key)?;
        let mut file = match fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(&path, e)),
        };
        let meta = file.metadata().map_err(|e| io_err(&path, e))?;
        if !meta.is_file() {
            return Ok(None);
        }
        if meta.len() > limit {
            return Err(StoreError::TooLarge {
                size: meta.len(),
                limit,
            });
        }
        let mut value = Vec::with_capacity(meta.len() as usize);
        // `take`: a value that grows while it is read is still refused past the limit.
        (&mut file)
            .take(limit + 1)
            .read_to_end(&mut value)
            .map_err(|e| io_err(&path, e))?;
        if value.len() as u64 > limit {
            return Err(StoreError::TooLarge {
                size: value.len() as u64,
                limit,
            });
        }
        Ok(Some(value))
    }

    fn exists(&self, key: &str) -> StoreResult<bool> {
        let path = self.path_of(key)?;
        match fs::metadata(&path) {
            Ok(m) => Ok(m.is_file()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err(&path, e)),
        }
    }

    fn remove(&self, key: &str) -> StoreResult<bool> {
        let path = self.path_of(key)?;
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err(&path, e)),
        }
    }

    fn modified(&self, key: &str) -> StoreResult<Option<std::time::SystemTime>> {
        let path = self.path_of(key)?;
        match fs::metadata(&path) {
            Ok(m) if m.is_file() => m.modified().map(Some).map_err(|e| io_err(&path, e)),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path, e)),
        }
    }

    fn size(&self, key: &str) -> StoreResult<Option<u64>> {
        let path = self.path_of(key)?;
        match fs::metadata(&path) {
            Ok(m) if m.is_file() => Ok(Some(m.len())),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path, e)),
        }
    }

    fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        // Walk only the deepest directory the prefix names completely.
        let start = match prefix.rfind('/') {
            Some(i) => self.root.join(&prefix[..i]),
            None => self.root.clone(),
        };
        let mut keys = Vec::new();
        for entry in walkdir::WalkDir::new(&start).follow_links(false) {
            let entry = match entry {
                Ok(e) => e,
                Err(e)
                    if e.io_error()
                        .is_some_and(|io| io.kind() == ErrorKind::NotFound) =>
                {
                    continue;
                }
                Err(e) => {
                    return Err(StoreError::Other(format!(
                        "listing {}: {e}",
                        start.display()
                    )));
                }
            };
            if !entry.file_type().is_file() {
                continue;
            }
            let Ok(rel) = entry.path().strip_prefix(&self.root) else {
                continue;
            };
            let Some(key) = rel.to_str() else { continue };
            if key.starts_with(prefix) && !key.starts_with(".tmp/") {
                keys.push(key.to_owned());
            }
        }
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conformance() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        super::super::conformance::run_all(&store, "conformance-test").unwrap();
    }

    #[test]
    fn stale_temp_files_of_killed_puts_are_removed_and_fresh_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let tmp = dir.path().join(TMP_DIR);
        fs::write(tmp.join(".tmpOLD"), b"half a pack").unwrap();
        fs::write(tmp.join(".tmpNEW"), b"a put in progress").unwrap();
        let old = std::time::SystemTime::now() - STALE_TEMP_AGE - std::time::Duration::from_secs(5);
        fs::File::options()
            .write(true)
            .open(tmp.join(".tmpOLD"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        store.put("ns/k", b"v", ValueClass::Bulk).unwrap();
        drop(store);
        // Reopening (what the next publish or gc does) removes the stale one only.
        let store = LocalStore::open(dir.path()).unwrap();
        assert!(!tmp.join(".tmpOLD").exists());
        assert!(tmp.join(".tmpNEW").exists());
        assert_eq!(store.get("ns/k").unwrap().as_deref(), Some(&b"v"[..]));
    }

    #[test]
    fn keys_cannot_escape_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path().join("s")).unwrap();
        for bad in ["../x", "a/../../x", "/abs", ".tmp/x", "a b"] {
            assert!(
                matches!(
                    store.put(bad, b"v", ValueClass::Bulk),
                    Err(StoreError::InvalidKey(_))
                ),
                "{bad}"
            );
        }
    }
}
