//! The already-current fast path: a root that still holds, file for file, the generation its
//! install record says is whole there (`StoredRecord::whole`) needs no manifest. Every pod restart
//! runs an install that finds its root current; checking the record's stamps against the disk
//! replaces fetching and parsing the manifest (5 MB for a 20,000-file cache), and the check can
//! start before the store is open (`RecordedChecks`), beside connecting and gathering facts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::confined::Kind;
use crate::generation::GenerationId;

use super::diff::{Looked, look_up};
use super::record::{Installed, StoredRecord, mtime_ns};
use super::target::resolve_root;

/// A root found exactly as its record stamped it right after the install.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsRecorded {
    pub generation: GenerationId,
    /// Files of the generation, every one of them in the root.
    pub files: u64,
}

/// Whether `root` holds the whole generation its record names for `cache_kind`, each file with
/// the size, inode and mtime stamped right after the install (a rewrite in place changes the
/// mtime, a file renamed over it the inode). Read only, without the install lock: a concurrent
/// install that changes a file makes the stamps differ, and one that has not begun changing
/// them comes after this install. `None` whenever anything differs or cannot be read: the
/// install then reads the manifest as usual.
pub fn check(root: &Path, cache_kind: &str) -> Option<AsRecorded> {
    let t = Instant::now();
    let record = StoredRecord::read_whole(root).filter(|r| r.cache_kind == cache_kind)?;
    let generation: GenerationId = record.generation.parse().ok()?;
    let dir = resolve_root(root).ok()?.dir?;
    let paths: Vec<&str> = record.files.keys().map(String::as_str).collect();
    let looked = look_up(&dir, &paths).ok()?;
    let unchanged =
        record
            .files
            .values()
            .zip(&looked)
            .all(|(stamp, on_disk)| match (stamp, on_disk) {
                (Installed::Stamped(s), Looked::At(Some(e))) => {
                    e.kind == Kind::File
                        && e.size == s.size
                        && e.ino == s.ino
                        && mtime_ns(e.mtime_s, e.mtime_ns) == s.mtime_ns
                }
                _ => false,
            });
    tracing::debug!(
        ms = t.elapsed().as_millis() as u64,
        files = paths.len(),
        unchanged,
        "compared the root with its install record"
    );
    unchanged.then_some(AsRecorded {
        generation,
        files: paths.len() as u64,
    })
}

/// The checks under way, by cache kind and root.
type Pending = HashMap<(String, PathBuf), mpsc::Receiver<Option<AsRecorded>>>;

/// [`check`]s started early, one thread per root, for an install to take when it begins.
#[derive(Debug, Clone, Default)]
pub struct RecordedChecks {
    pending: Arc<Mutex<Pending>>,
}

impl RecordedChecks {
    /// Starts checking each `(cache kind, root)`.
    pub fn start<'a>(roots: impl IntoIterator<Item = (&'a str, &'a Path)>) -> Self {
        let checks = Self::default();
        for (kind, root) in roots {
            let (tx, rx) = mpsc::channel();
            let key = (kind.to_owned(), root.to_owned());
            let (kind, owned) = key.clone();
            let spawned = std::thread::Builder::new()
                .name("recorded-check".into())
                .spawn(move || {
                    let _ = tx.send(check(&owned, &kind));
                });
            if spawned.is_ok() {
                checks.lock().insert(key, rx);
            }
        }
        checks
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The check of `root` for `cache_kind`: the one started early if there is one (waiting for
    /// it), else made now.
    pub(super) fn take(&self, root: &Path, cache_kind: &str) -> Option<AsRecorded> {
        let early = self
            .lock()
            .remove(&(cache_kind.to_owned(), root.to_owned()));
        match early {
            Some(rx) => rx.recv().ok().flatten(),
            None => check(root, cache_kind),
        }
    }
}
