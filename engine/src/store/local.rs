//! The embedded store: one file per key under a directory. Same contract as Mooncake, plus
//! listing. Writes go to a temp file, are fsynced, then hard-linked into place with
//! `persist_noclobber` (link(2) fails if the key exists, which is exactly the immutable put, even
//! with several processes writing at once), then the directory is fsynced.

use std::fs;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use super::{Store, StoreError, StoreResult, check_key};

const TMP_DIR: &str = ".tmp";

#[derive(Debug)]
pub struct LocalStore {
    root: PathBuf,
}

impl LocalStore {
    /// Opens (and creates) the store directory.
    pub fn open(root: impl Into<PathBuf>) -> StoreResult<Self> {
        let root = root.into();
        fs::create_dir_all(root.join(TMP_DIR)).map_err(|e| io_err(&root, e))?;
        Ok(Self { root })
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
            source: e,
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

    fn put(&self, key: &str, value: &[u8]) -> StoreResult<()> {
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
        tmp.as_file()
            .sync_all()
            .map_err(|e| io_err(tmp.path(), e))?;
        match tmp.persist_noclobber(&path) {
            Ok(_) => {}
            Err(e) if e.error.kind() == ErrorKind::AlreadyExists => return Ok(()),
            Err(e) => return Err(io_err(&path, e.error)),
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
    fn keys_cannot_escape_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path().join("s")).unwrap();
        for bad in ["../x", "a/../../x", "/abs", ".tmp/x", "a b"] {
            assert!(
                matches!(store.put(bad, b"v"), Err(StoreError::InvalidKey(_))),
                "{bad}"
            );
        }
    }
}
