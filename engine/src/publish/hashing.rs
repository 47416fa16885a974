//! Hashing the selected files: the hash cache kept between publishes, the stored (possibly
//! canonical) form of a file, and reuse of hashes from the parent manifest.

use std::collections::HashMap;
use std::path::Path;

use rayon::prelude::*;

use crate::generation::{ContentHash, FileRecord, Manifest, RelPath, hash_file};
use crate::policy::CachePolicy;
use crate::scan::ScannedFile;

use super::packs::KeptContents;
use super::{PublishError, PublishReport};

/// Remembers file hashes between publishes of one root (the watcher keeps one), keyed by path and
/// checked against size, mtime and inode, so an unchanged file is never hashed (or canonicalized)
/// twice.
#[derive(Debug, Default)]
pub struct HashCache {
    entries: HashMap<RelPath, (u64, i64, u32, u64, Stored)>,
}

impl HashCache {
    fn lookup(&self, f: &ScannedFile) -> Option<Stored> {
        let &(size, s, ns, ino, stored) = self.entries.get(&f.path)?;
        (size == f.size && s == f.mtime_s && ns == f.mtime_ns && ino == f.ino).then_some(stored)
    }

    fn remember(&mut self, f: &ScannedFile, stored: Stored) {
        self.entries.insert(
            f.path.clone(),
            (f.size, f.mtime_s, f.mtime_ns, f.ino, stored),
        );
    }
}

/// What a selected file is stored as: its bytes, or for a file whose decision says it embeds the
/// root, the policy's root-independent form of them (so pods at different roots store the same
/// bytes once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stored {
    pub(super) hash: ContentHash,
    pub(super) size: u64,
    pub(super) canonical: bool,
}

/// Largest file jitship canonicalizes (files that embed the root are small metadata: Triton
/// groups are a few KiB); a larger one is refused rather than read whole into memory.
const CANONICALIZE_LIMIT: u64 = 16 << 20;

/// The root-independent form of `f` (`policy.canonicalize` on its whole content).
pub(super) fn canonical_bytes(
    policy: &dyn CachePolicy,
    root: &Path,
    f: &ScannedFile,
) -> Result<Vec<u8>, PublishError> {
    let path = f.path.to_path(root);
    let read_err = |source| PublishError::Read {
        path: path.clone(),
        source,
    };
    if f.size > CANONICALIZE_LIMIT {
        return Err(read_err(std::io::Error::other(format!(
            "{} bytes: too large for a file that embeds the cache root (limit {CANONICALIZE_LIMIT})",
            f.size
        ))));
    }
    let bytes = std::fs::read(&path).map_err(read_err)?;
    if bytes.len() as u64 != f.size {
        return Err(read_err(std::io::Error::other(
            "file changed while it was read; retry the publish",
        )));
    }
    policy
        .canonicalize(root, &f.path, &bytes)
        .map_err(|source| PublishError::Canonicalize {
            path: f.path.clone(),
            source,
        })
}

/// Hashes of the selected files: from the hash cache, from the parent manifest when size and
/// mtime match, otherwise by reading the file (in parallel). A file that embeds the root
/// (`embeds_root` in its decision) is hashed in its canonical form, never taken from the parent
/// by size (the parent's size is that of the canonical bytes).
pub(super) fn hash_selected<'a>(
    policy: &dyn CachePolicy,
    root: &Path,
    selected: &[(&'a ScannedFile, bool)],
    parent: Option<&Manifest>,
    cache: &mut HashCache,
    kept: &KeptContents,
    report: &mut PublishReport,
) -> Result<Vec<(&'a ScannedFile, Stored)>, PublishError> {
    let known: HashMap<&RelPath, &FileRecord> = parent
        .iter()
        .flat_map(|m| &m.files)
        .map(|f| (&f.path, f))
        .collect();
    let results: Vec<Result<(Stored, bool), PublishError>> = selected
        .par_iter()
        .map(|&(f, embeds_root)| {
            if let Some(s) = cache.lookup(f).filter(|s| s.canonical == embeds_root) {
                return Ok((s, false));
            }
            if embeds_root {
                let bytes = canonical_bytes(policy, root, f)?;
                let stored = Stored {
                    hash: ContentHash::of(&bytes),
                    size: bytes.len() as u64,
                    canonical: true,
                };
                kept.offer(stored.hash, bytes);
                return Ok((stored, true));
            }
            if let Some(p) = known.get(&f.path).filter(|p| {
                !p.canonical
                    && p.size == f.size
                    && p.mtime_s == f.mtime_s
                    && p.mtime_ns == f.mtime_ns
            }) {
                let stored = Stored {
                    hash: p.blake3,
                    size: p.size,
                    canonical: false,
                };
                return Ok((stored, false));
            }
            let path = f.path.to_path(root);
            let read_err = |source| PublishError::Read {
                path: path.clone(),
                source,
            };
            let (hash, len) = if kept.reserve(f.size) {
                // Small enough to keep: read whole, hashed from memory, and packed from memory.
                let bytes = std::fs::read(&path).map_err(read_err)?;
                let (hash, len) = (ContentHash::of(&bytes), bytes.len() as u64);
                kept.keep(hash, bytes, f.size);
                (hash, len)
            } else {
                hash_file(&path).map_err(read_err)?
            };
            if len != f.size {
                return Err(PublishError::Read {
                    path,
                    source: std::io::Error::other(
                        "file changed while it was hashed; retry the publish",
                    ),
                });
            }
            let stored = Stored {
                hash,
                size: len,
                canonical: false,
            };
            Ok((stored, true))
        })
        .collect();
    let mut out = Vec::with_capacity(selected.len());
    for ((f, _), r) in selected.iter().zip(results) {
        let (stored, hashed) = r?;
        report.files_hashed += u64::from(hashed);
        cache.remember(f, stored);
        out.push((*f, stored));
    }
    Ok(out)
}
