//! Hashing the selected files: the hash cache kept between publishes, the stored (possibly
//! canonical) form of a file, and reuse of hashes from the parent manifest.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rayon::prelude::*;

use crate::confined::{self, Confined};
use crate::generation::{ContentHash, FileRecord, Manifest, RelPath, hash_open_file};
use crate::interrupt::Interrupt;
use crate::policy::CachePolicy;
use crate::scan::ScannedFile;

use super::packs::KeptContents;
use super::{PublishError, PublishReport};

/// What reads the root's selected files, to hash them and again to pack them: the policy (for
/// the canonical form of files that embed the root), the root, the contents kept in between, and
/// the interrupt looked at per file.
pub(super) struct RootReader<'a> {
    pub(super) policy: &'a dyn CachePolicy,
    pub(super) files: &'a RootFiles<'a>,
    pub(super) kept: &'a KeptContents,
    pub(super) interrupt: &'a Interrupt,
}

/// Remembers file hashes between publishes of one root (the watcher keeps one), keyed by path and
/// checked against size, mtime and inode, so an unchanged file is never hashed (or canonicalized)
/// twice.
#[derive(Debug, Default)]
pub struct HashCache {
    entries: HashMap<RelPath, (u64, i64, u32, u64, Stored)>,
    /// Generations whose packs this watcher read back and checked, or wrote itself: a parent is
    /// checked once, not every round (`publish::check_parent_packs`).
    checked: std::collections::HashSet<crate::generation::GenerationId>,
}

/// Most generations a watcher remembers as checked (it needs only its current parent).
const MAX_CHECKED: usize = 64;

impl HashCache {
    pub(super) fn is_checked(&self, id: &crate::generation::GenerationId) -> bool {
        self.checked.contains(id)
    }

    pub(super) fn note_checked(&mut self, id: crate::generation::GenerationId) {
        if self.checked.len() >= MAX_CHECKED {
            self.checked.clear();
        }
        self.checked.insert(id);
    }

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

/// The scanned root's files, opened beneath one descriptor of the root: a file swapped for a link
/// after the scan, or a directory on its path swapped for one, is refused instead of followed out
/// of the root. The root itself may be a link (an operator's choice); it is resolved once, here.
/// A reader keeps the directory of the last file it opened ([`LastDir`]): files taken in path
/// order cost one `openat` of a name each, not a lookup from `/` and a `statx` as a path would.
pub(super) struct RootFiles<'a> {
    /// The root as configured: what the policy and the messages see.
    root: &'a Path,
    /// None when there is no root (nothing was scanned, so nothing is read).
    dir: Option<Confined>,
}

impl<'a> RootFiles<'a> {
    pub(super) fn open(root: &'a Path) -> Result<Self, PublishError> {
        let dir = match root.canonicalize().and_then(|real| Confined::open(&real)) {
            Ok(dir) => Some(dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(PublishError::Scan {
                    root: root.into(),
                    source,
                });
            }
        };
        Ok(Self { root, dir })
    }

    pub(super) fn root(&self) -> &Path {
        self.root
    }

    /// Opens the regular file `f` for reading, through `last`'s directory when it is `f`'s.
    pub(super) fn open_file(
        &self,
        f: &ScannedFile,
        last: &mut LastDir,
    ) -> Result<File, PublishError> {
        let err = |source| self.read_error(f, source);
        let (dir, name) = confined::split(f.path.as_str());
        if last.as_ref().is_none_or(|(d, _)| d != dir) {
            let root = self
                .dir
                .as_ref()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
                .map_err(err)?;
            let (fd, _) = root.parent_of(f.path.as_str()).map_err(err)?;
            *last = Some((dir.to_owned(), fd));
        }
        let (_, fd) = last.as_ref().expect("set above");
        confined::open_read_at(fd.as_fd(), name).map_err(err)
    }

    /// Reads `f` whole (callers bound its size); a size other than the scanned one means the file
    /// changed since the scan.
    pub(super) fn read(
        &self,
        f: &ScannedFile,
        last: &mut LastDir,
    ) -> Result<Vec<u8>, PublishError> {
        let mut bytes = Vec::with_capacity(f.size as usize);
        self.open_file(f, last)?
            .read_to_end(&mut bytes)
            .map_err(|source| self.read_error(f, source))?;
        if bytes.len() as u64 != f.size {
            return Err(self.changed(f));
        }
        Ok(bytes)
    }

    pub(super) fn read_error(&self, f: &ScannedFile, source: io::Error) -> PublishError {
        PublishError::Read {
            path: f.path.to_path(self.root),
            source,
        }
    }

    pub(super) fn changed(&self, f: &ScannedFile) -> PublishError {
        self.read_error(
            f,
            io::Error::other("file changed while it was published; retry the publish"),
        )
    }
}

/// The directory (relative to the root) of the last file a reader opened, and its descriptor.
pub(super) type LastDir = Option<(String, OwnedFd)>;

/// Largest file jitship canonicalizes (files that embed the root are small metadata: Triton
/// groups are a few KiB); a larger one is refused rather than read whole into memory.
const CANONICALIZE_LIMIT: u64 = 16 << 20;

/// The root-independent form of `f` (`policy.canonicalize` on its whole content).
pub(super) fn canonical_bytes(
    policy: &dyn CachePolicy,
    files: &RootFiles,
    f: &ScannedFile,
    last: &mut LastDir,
) -> Result<Vec<u8>, PublishError> {
    if f.size > CANONICALIZE_LIMIT {
        return Err(files.read_error(
            f,
            io::Error::other(format!(
                "{} bytes: too large for a file that embeds the cache root (limit {CANONICALIZE_LIMIT})",
                f.size
            )),
        ));
    }
    let bytes = files.read(f, last)?;
    policy
        .canonicalize(files.root(), &f.path, &bytes)
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
    reader: &RootReader,
    selected: &[(&'a ScannedFile, bool)],
    parent: Option<&Manifest>,
    mut cache: Option<&mut HashCache>,
    report: &mut PublishReport,
) -> Result<Vec<(&'a ScannedFile, Stored)>, PublishError> {
    let &RootReader {
        policy,
        files,
        kept,
        interrupt,
    } = reader;
    let known: HashMap<&RelPath, &FileRecord> = parent
        .iter()
        .flat_map(|m| &m.files)
        .map(|f| (&f.path, f))
        .collect();
    let remembered = cache.as_deref();
    let results: Vec<Result<(Stored, bool), PublishError>> = selected
        .par_iter()
        // Each worker keeps the directory of its last file: its files come in path order.
        .map_init(LastDir::default, |last, &(f, embeds_root)| {
            if let Some(signal) = interrupt.signal_name() {
                return Err(PublishError::Interrupted(signal));
            }
            if let Some(s) = remembered
                .and_then(|c| c.lookup(f))
                .filter(|s| s.canonical == embeds_root)
            {
                return Ok((s, false));
            }
            if embeds_root {
                let bytes = canonical_bytes(policy, files, f, last)?;
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
            Ok((read_and_hash(files, kept, f, last)?, true))
        })
        .collect();
    let mut out = Vec::with_capacity(selected.len());
    for ((f, _), r) in selected.iter().zip(results) {
        let (stored, hashed) = r?;
        report.files_hashed += u64::from(hashed);
        if let Some(cache) = cache.as_deref_mut() {
            cache.remember(f, stored);
        }
        out.push((*f, stored));
    }
    Ok(out)
}

/// Hashes a file as it is on disk: a small one read whole and kept for its pack (hashed and
/// packed from memory), a larger one streamed (read again when its pack is filled).
fn read_and_hash(
    files: &RootFiles,
    kept: &KeptContents,
    f: &ScannedFile,
    last: &mut LastDir,
) -> Result<Stored, PublishError> {
    let hash = if kept.reserve(f.size) {
        let bytes = files.read(f, last)?;
        let hash = ContentHash::of(&bytes);
        kept.keep(hash, bytes, f.size);
        hash
    } else {
        let (hash, len) = hash_open_file(&mut files.open_file(f, last)?)
            .map_err(|source| files.read_error(f, source))?;
        if len != f.size {
            return Err(files.changed(f));
        }
        hash
    };
    Ok(Stored {
        hash,
        size: f.size,
        canonical: false,
    })
}
